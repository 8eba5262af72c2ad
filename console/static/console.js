// Compute Broker console: live content over server-sent events, and keyboard shortcuts.
// Plain JavaScript shipped with the package (no framework, nothing fetched at run time).
(function () {
  "use strict";
  var main = document.getElementById("main");
  var state = document.getElementById("live-state");

  function setState(text, cls) {
    if (state) { state.textContent = text; state.className = "live " + cls; }
  }

  function syncAttributes(from, to) {
    for (var i = from.attributes.length - 1; i >= 0; i--) {
      var name = from.attributes[i].name;
      if (name !== "open" && !to.hasAttribute(name)) { from.removeAttribute(name); }
    }
    for (var j = 0; j < to.attributes.length; j++) {
      var a = to.attributes[j];
      if (from.getAttribute(a.name) !== a.value) { from.setAttribute(a.name, a.value); }
    }
  }

  // Make `from`'s children look like `to`'s while keeping every node that is still there
  // (position by position): a button being pressed, a focused field, what the user typed
  // (an input's value property) and an opened <details> all survive a refresh.
  function morph(from, to) {
    var f = from.firstChild, t = to.firstChild;
    while (t) {
      var nextT = t.nextSibling;
      if (!f) { from.appendChild(t); t = nextT; continue; }
      var nextF = f.nextSibling;
      if (f.nodeType !== t.nodeType || f.nodeName !== t.nodeName) {
        from.replaceChild(t, f);
      } else if (f.nodeType === 1) {
        syncAttributes(f, t);
        morph(f, t);
      } else if (f.nodeValue !== t.nodeValue) {
        f.nodeValue = t.nodeValue;
      }
      f = nextF;
      t = nextT;
    }
    while (f) { var n = f.nextSibling; from.removeChild(f); f = n; }
  }

  // The job page's log: keep it scrolled to its newest line unless the reader scrolled up,
  // and filter its lines by the search field (the filter survives live refreshes).
  function logAtEnd(pre) { return pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24; }
  function applyLogFilter() {
    var input = document.getElementById("log-search");
    var pre = input && document.querySelector(input.getAttribute("data-filter"));
    if (!pre) { return; }
    var q = input.value.toLowerCase(), lines = pre.querySelectorAll(".ln"), hits = 0;
    for (var i = 0; i < lines.length; i++) {
      var hit = !q || lines[i].textContent.toLowerCase().indexOf(q) >= 0;
      lines[i].classList.toggle("miss", !hit);
      lines[i].classList.toggle("hit", !!q && hit);
      if (hit) { hits++; }
    }
    var out = document.getElementById("log-matches");
    if (out) { out.textContent = q ? hits + " of " + lines.length + " lines match" : ""; }
  }
  function tailLog() {
    var pre = document.querySelector("pre.log[data-tail]");
    if (pre) { pre.scrollTop = pre.scrollHeight; }
  }
  document.addEventListener("input", function (e) {
    if (e.target && e.target.id === "log-search") { applyLogFilter(); tailLog(); }
  });
  tailLog();

  // Back from an action (its redirect names the region's operator forms): keep them open.
  if (window.location.hash) {
    var target = document.getElementById(decodeURIComponent(window.location.hash.slice(1)));
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }

  // The server sends the page's new <main> content ("html" events) when it changed.
  if (main && main.dataset.live && window.EventSource) {
    var es = new EventSource(main.dataset.live);
    es.addEventListener("open", function () { setState("live", "on"); });
    es.addEventListener("error", function () { setState("reconnecting", "off"); });
    es.addEventListener("problem", function (e) { setState("broker: " + e.data, "off"); });
    es.addEventListener("html", function (e) {
      var next = document.createElement("main");
      next.innerHTML = e.data;
      var pre = document.querySelector("pre.log[data-tail]");
      var follow = !pre || logAtEnd(pre);
      morph(main, next);
      applyLogFilter();
      if (follow) { tailLog(); }
      setState("live", "on");
      document.body.dataset.updated = String(Date.now());
    });
  }

  // Clicking a node cell opens its region's (folded) operator forms and puts the node's
  // id in the cordon form.
  document.addEventListener("click", function (e) {
    var cell = e.target.closest && e.target.closest(".cell[data-node]");
    var region = cell && cell.closest("section.region");
    var input = region && region.querySelector("input[data-region-input]");
    if (input) {
      var ops = input.closest("details");
      if (ops) { ops.open = true; }
      input.value = cell.getAttribute("data-node");
      input.focus();
    }
  });

  // Confirm destructive actions (drain, cancel) before the form posts.
  document.addEventListener("submit", function (e) {
    var btn = e.submitter || (e.target.querySelector && e.target.querySelector("[data-confirm]"));
    var msg = btn && btn.getAttribute && btn.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });

  // Shortcuts: "/" finds a job; "g" then f/q/j/m/p/c goes to a page.
  var pending = false;
  var pages = { f: "/fleet", q: "/queue", j: "/jobs", m: "/migrations", p: "/plans", c: "/charts" };
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
