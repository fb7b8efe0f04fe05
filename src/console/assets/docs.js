// The API reference at /docs: Redoc (vendored, MIT) renders the service's own openapi.yaml.
// Search is off: it runs in a Worker made from a blob: URL, which the page's CSP does not allow.
"use strict";
(function () {
  var el = document.getElementById("reference");
  window.Redoc.init(
    "/openapi.yaml",
    {
      disableSearch: true,
      expandResponses: "200,201,202",
      jsonSampleExpandLevel: 2,
      hideHostname: false,
      pathInMiddlePanel: true,
      sortTagsAlphabetically: false,
      theme: { sidebar: { width: "280px" } },
    },
    el,
    function (err) {
      if (err) {
        el.textContent = "The API reference could not be drawn: " + err + ". The document is at /openapi.yaml.";
      }
      document.documentElement.setAttribute("data-reference", err ? "failed" : "ready");
    }
  );
})();
