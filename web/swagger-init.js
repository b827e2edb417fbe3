// Starts Swagger UI on /docs (see api/docs.py). A file, not an inline script, so the page works
// under a Content-Security-Policy of script-src 'self'; the spec URL comes from a data attribute.
"use strict";

window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.openapiUrl,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // the default would send the spec's URL to validator.swagger.io
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
