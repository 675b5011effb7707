// The API reference: Redoc (a static file of drf-spectacular-sidecar: nothing is loaded from elsewhere) renders the
// console's own OpenAPI schema in the console's colours and fonts.

const container = document.getElementById("api-reference");
const sans = 'system-ui, -apple-system, "Segoe UI", sans-serif';

window.Redoc.init(container.dataset.schemaUrl, {
  expandResponses: "200,201,202",
  hideHostname: true,
  theme: {
    colors: { primary: { main: "#2357c6" }, text: { primary: "#1d2430" } },
    typography: {
      fontFamily: sans,
      fontSize: "15px",
      headings: { fontFamily: sans, fontWeight: "600" },
      code: { fontFamily: "ui-monospace, SFMono-Regular, Menlo, monospace" },
    },
    sidebar: { backgroundColor: "#f4f6f9" },
  },
}, container);
