// Compute Broker console: live content over server-sent events, and keyboard shortcuts.
// Plain JavaScript shipped with the package (no framework, nothing fetched at run time).
(function () {
  "use strict";
  var main = document.getElementById("main");
  var state = document.getElementById("live-state");

  function setState(text, cls) {
    if (state) { state.textContent = text; state.className = "live " + cls; }
  }

  // The server sends the page's new <main> content ("html" events) when it changed.
  if (main && main.dataset.live && window.EventSource) {
    var es = new EventSource(main.dataset.live);
    es.addEventListener("open", function () { setState("live", "on"); });
    es.addEventListener("error", function () { setState("reconnecting", "off"); });
    es.addEventListener("problem", function (e) { setState("broker: " + e.data, "off"); });
    es.addEventListener("html", function (e) {
      var focused = document.activeElement;
      var key = focused && (focused.id || focused.getAttribute("data-attempt"));
      var open = Array.prototype.map.call(main.querySelectorAll("details[open] summary"),
                                          function (s) { return s.textContent; });
      var typed = {};  // what the user is typing survives the refresh
      Array.prototype.forEach.call(main.querySelectorAll("input[id]:not([type=hidden])"),
                                   function (i) { if (i.value) { typed[i.id] = i.value; } });
      main.innerHTML = e.data;
      Object.keys(typed).forEach(function (id) {
        var i = document.getElementById(id);
        if (i) { i.value = typed[id]; }
      });
      Array.prototype.forEach.call(main.querySelectorAll("details summary"), function (s) {
        if (open.indexOf(s.textContent) >= 0) { s.parentNode.open = true; }
      });
      if (key) {  // keep the keyboard user's place
        var again = document.getElementById(key) ||
                    main.querySelector('[data-attempt="' + key + '"]');
        if (again) { again.focus(); }
      }
      document.body.dataset.updated = String(Date.now());
    });
  }

  // Clicking a node cell puts its id in its region's cordon form.
  document.addEventListener("click", function (e) {
    var cell = e.target.closest && e.target.closest(".cell[data-node]");
    var region = cell && cell.closest("section.region");
    var input = region && region.querySelector("input[data-region-input]");
    if (input) { input.value = cell.getAttribute("data-node"); input.focus(); }
  });

  // Confirm destructive actions (drain, cancel) before the form posts.
  document.addEventListener("submit", function (e) {
    var btn = e.submitter || (e.target.querySelector && e.target.querySelector("[data-confirm]"));
    var msg = btn && btn.getAttribute && btn.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });

  // Shortcuts: "/" finds a job; "g" then f/q/j/m/p goes to a page.
  var pending = false;
  var pages = { f: "/fleet", q: "/queue", j: "/jobs", m: "/migrations", p: "/plans" };
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA") || e.ctrlKey || e.metaKey || e.altKey) { return; }
    if (e.key === "/") {
      var find = document.getElementById("find-job");
      if (find) { e.preventDefault(); find.focus(); }
    } else if (pending && pages[e.key]) {
      window.location.href = pages[e.key];
    }
    pending = e.key === "g";
  });
})();
