// sasctl console: live refresh, embedded in the binary (cli/src/console/server.rs).
// A page marked data-live="yes" reads its own URL again every 2 s and swaps in its
// #live part, only while the tab is visible: nobody looking, nothing read.
(function () {
  "use strict";
  if (document.body.dataset.live !== "yes") return;
  var busy = false;
  function refresh() {
    if (busy || document.visibilityState !== "visible") return;
    var live = document.getElementById("live");
    if (!live) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (fresh) live.innerHTML = fresh.innerHTML;
        var note = document.getElementById("live-note");
        if (note) note.dataset.read = new Date().toISOString();
      })
      .catch(function (status) {
        var note = document.getElementById("live-note");
        if (note) note.textContent = "live refresh failed (" + status + "): reload the page";
      })
      .finally(function () { busy = false; });
  }
  setInterval(refresh, 2000);
  document.addEventListener("visibilitychange", refresh);
})();
