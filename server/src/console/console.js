// The console's one script: it keeps an events table live. The table is
// written by the server (newest first); new events arrive as server-sent
// events from /events/stream and are put on top. Text only, never HTML.
"use strict";

(function () {
  const rows = document.getElementById("events-rows");
  const live = document.getElementById("live");
  if (!rows || !live || !window.EventSource) {
    return;
  }
  const after = live.dataset.after || "0";
  const source = new EventSource("/events/stream?after=" + encodeURIComponent(after));
  source.onopen = function () {
    live.textContent = "live";
    live.className = "on";
  };
  source.onerror = function () {
    live.textContent = "reconnecting…";
    live.className = "off";
  };
  source.onmessage = function (message) {
    const e = JSON.parse(message.data);
    if (rows.querySelector('tr[data-event="' + String(e.id) + '"]')) {
      return;
    }
    const row = document.createElement("tr");
    row.dataset.event = String(e.id);
    row.className = "new";
    const cell = function (child) {
      const td = document.createElement("td");
      td.appendChild(child);
      row.appendChild(td);
    };
    cell(document.createTextNode(e.time));
    cell(document.createTextNode(e.kind));
    if (e.node) {
      const a = document.createElement("a");
      a.href = "/nodes/" + encodeURIComponent(e.node);
      a.textContent = e.node;
      cell(a);
    } else {
      cell(document.createTextNode("-"));
    }
    cell(document.createTextNode(e.detail));
    rows.insertBefore(row, rows.firstChild);
    while (rows.rows.length > 500) {
      rows.deleteRow(rows.rows.length - 1);
    }
  };
})();
