// Auto-refresh: reload the page every data-refresh seconds (0 = off), unless the operator is
// typing or has text selected. The only script the dashboard runs.
(function () {
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!(seconds > 0)) { return; }
  setInterval(function () {
    var busy = document.activeElement && /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
    var selecting = window.getSelection && String(window.getSelection()).length > 0;
    if (!busy && !selecting && document.visibilityState !== "hidden") { window.location.reload(); }
  }, seconds * 1000);
})();
