// The page's live refresh (docs/operations/web-ui.md, "Live pages"). The pages are whole
// without it: this only reads the same page again every few seconds (its address, the
// session cookie the browser already sends) and swaps in the parts marked data-live whose
// HTML changed, so what a plain reload would show appears by itself. The interval is the
// server's (data-refresh-ms on <body>: 0 turns it off); a hidden tab is not refreshed until
// it is shown again; a failed read is retried less and less often and said in the header.
// A part is left alone while text in it is selected; <details> opened stay open.
(function () {
  "use strict";
  var marker = document.getElementById("live");
  var every = Number(document.body.getAttribute("data-refresh-ms") || "0");
  var failures = 0;
  var timer = null;
  var busy = false;
  var lastOk = "";
  if (!every || !marker || !window.fetch || !window.DOMParser) {
    return;
  }
  marker.hidden = false;

  function clock() {
    return new Date().toISOString().slice(11, 19);
  }

  function say(text, problem) {
    marker.textContent = text;
    marker.classList.toggle("stale", Boolean(problem));
  }

  function schedule(ms) {
    if (timer !== null) {
      clearTimeout(timer);
    }
    timer = setTimeout(refresh, ms);
  }

  function selectedIn(node) {
    var selection = window.getSelection();
    if (!selection || selection.isCollapsed || selection.rangeCount === 0) {
      return false;
    }
    return node.contains(selection.getRangeAt(0).commonAncestorContainer);
  }

  function keepOpen(old, fresh) {
    // <details> by position within the part: the page's structure is the server's, stable.
    var before = old.querySelectorAll("details");
    var after = fresh.querySelectorAll("details");
    for (var i = 0; i < before.length && i < after.length; i++) {
      if (before[i].open) {
        after[i].setAttribute("open", "");
      } else {
        after[i].removeAttribute("open");
      }
    }
  }

  function swap(doc) {
    var parts = document.querySelectorAll("[data-live]");
    var changed = 0;
    for (var i = 0; i < parts.length; i++) {
      var old = parts[i];
      var fresh = old.id ? doc.getElementById(old.id) : null;
      if (!fresh || fresh.outerHTML === old.outerHTML || selectedIn(old)) {
        continue;
      }
      keepOpen(old, fresh);
      old.replaceWith(document.importNode(fresh, true));
      changed++;
    }
    var title = doc.querySelector("title");
    if (title) {
      document.title = title.textContent;
    }
    var next = Number(doc.body.getAttribute("data-refresh-ms") || "0");
    return { changed: changed, next: next };
  }

  function refresh() {
    timer = null;
    if (document.hidden || busy) {
      return; // visibilitychange starts again, or the read under way schedules the next
    }
    busy = true;
    fetch(window.location.href, {
      credentials: "same-origin",
      cache: "no-store",
      redirect: "manual",
      headers: { "X-Ductor-Refresh": "1" },
    })
      .then(function (reply) {
        if (reply.type === "opaqueredirect") {
          throw new Error("the session ended: reload the page to log in again");
        }
        if (!reply.ok) {
          throw new Error("the server answered " + reply.status);
        }
        return reply.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var done = swap(doc);
        busy = false;
        failures = 0;
        lastOk = clock();
        say("live · updated " + lastOk + " UTC", false);
        document.body.setAttribute("data-refreshed", String(Date.now()));
        if (done.next > 0) {
          every = done.next;
          schedule(every);
        }
      })
      .catch(function (error) {
        busy = false;
        failures++;
        say("not updated since " + lastOk + " UTC: " + error.message, true);
        schedule(Math.min(every * Math.pow(2, failures), 60000));
      });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && timer === null) {
      refresh();
    }
  });
  lastOk = clock();
  say("live · updated " + lastOk + " UTC", false);
  schedule(every);
})();
