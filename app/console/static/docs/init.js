// Starts Swagger UI on /api/v1/docs. Kept out of the page so the page needs no inline script.
(function () {
  "use strict";
  var container = document.getElementById("swagger-ui-container");
  var config = {
    url: container.getAttribute("data-spec-url"),
    dom_id: "#swagger-ui-container",
    // The online validator badge would load an image from a third-party origin.
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "BaseLayout",
    deepLinking: true
  };
  var overrides = JSON.parse(container.getAttribute("data-config") || "{}");
  Object.keys(overrides).forEach(function (key) { config[key] = overrides[key]; });
  window.ui = SwaggerUIBundle(config);
})();
