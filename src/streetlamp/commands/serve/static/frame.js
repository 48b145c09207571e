/* streetlamp serve: an empty report page that the live page fills with streetlamp.render (a minimal pair's side) */
(function () {
  "use strict";
  window.streetlamp.views.blank = async function (root) { root.textContent = "waiting for a result..."; };
})();
