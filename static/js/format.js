// Number formats shared by the pages' scripts: the same as the server's template filters
// (console/ui/templatetags/formatting.py), so a figure reads alike whoever drew it.

const MISSING = "—";
const SEPARATOR = " · ";

export function bytes(value) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let amount = Number(value) || 0;
  let unit = 0;
  while (Math.abs(amount) >= 1024 && unit < units.length - 1) {
    amount /= 1024;
    unit += 1;
  }
  return `${amount.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

export function tokens(value) {
  return (Number(value) || 0).toLocaleString("en-US");
}

// [7, 5, 4] -> "7 · 5 · 4": layers (or any count) per rank.
export function cut(values) {
  return values && values.length ? values.join(SEPARATOR) : MISSING;
}

// 6.3969 -> "6.40 ms".
export function ms(value, digits = 2) {
  return value == null ? MISSING : `${Number(value).toFixed(digits)} ms`;
}

// [6.3969, 4.5071] -> "6.40 · 4.51 ms": one figure per rank.
export function msList(values, digits = 2) {
  if (!values || !values.length) return MISSING;
  return `${values.map((value) => (value == null ? MISSING : Number(value).toFixed(digits))).join(SEPARATOR)} ms`;
}

// 1.0712 -> "1.07x".
export function speedup(value) {
  return value == null ? MISSING : `${Number(value).toFixed(2)}x`;
}
