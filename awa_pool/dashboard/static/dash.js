// awa_pool dashboard: the overview's live refresh and confirmations.
// Served as a file (the Content-Security-Policy allows no inline script).
(function () {
  "use strict";

  // Forms marked data-confirm ask before they submit (delegated, so forms
  // inside a refreshed fragment work too).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  function startRefresh(box) {
    var url = box.getAttribute("data-refresh");
    var status = document.getElementById("live-status");
    var busy = false;

    function say(text, bad) {
      if (!status) { return; }
      status.textContent = text;
      status.classList.toggle("down", !!bad);
    }

    function tick() {
      // no overlapping requests, and none while the tab is hidden or a
      // button inside the fragment has focus (the user is about to click)
      if (busy || document.hidden) { return; }
      if (box.contains(document.activeElement) && document.activeElement.tagName === "BUTTON") { return; }
      busy = true;
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.status === 503) { throw new Error("database unreachable: retrying"); }
          if (response.status === 401) { throw new Error("signed out: reload to sign in"); }
          if (!response.ok) { throw new Error("refresh failed (HTTP " + response.status + ")"); }
          return response.text();
        })
        .then(function (html) {
          box.innerHTML = html;   // server-rendered and escaped
          say("live · updated " + new Date().toLocaleTimeString(), false);
          box.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function (error) { say(error.message || "refresh failed", true); })
        .then(function () { busy = false; });
    }

    window.setInterval(tick, 2000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var boxes = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < boxes.length; i++) { startRefresh(boxes[i]); }
  });
})();
