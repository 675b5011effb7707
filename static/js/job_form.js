// The proposal form shows only the fieldset of the chosen kind (without this script all of them show).

const kind = document.querySelector("select[name=kind]");
if (kind) {
  const show = () => {
    for (const fieldset of document.querySelectorAll("fieldset[data-kind]")) {
      fieldset.hidden = fieldset.dataset.kind !== kind.value;
    }
  };
  kind.addEventListener("change", show);
  show();
}
