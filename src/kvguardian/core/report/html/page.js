// kv-guardian report: optional interaction. The page is complete without this script; it adds zoom along
// the time axis (drag over a chart, or the buttons) and tooltips that follow the pointer and keyboard focus.
(function () {
  "use strict";
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function bytes(v) {
    var i = 0; while (Math.abs(v) >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
    return i === 0 ? v.toFixed(0) + " B" : (Math.abs(v) < 100 ? v.toFixed(1) : v.toFixed(0)) + " " + UNITS[i];
  }
  function seconds(v) {
    var a = Math.abs(v);
    if (a < 1) { return (v * 1000).toFixed(0) + " ms"; }
    if (a < 120) { return Number(v.toPrecision(3)) + " s"; }
    if (a >= 172800) { return (v / 86400).toFixed(1) + " d"; }
    if (a >= 7200) { return (v / 3600).toFixed(1) + " h"; }
    return (v / 60).toFixed(1) + " min";
  }
  function ticks(lo, hi, n) {
    var raw = (hi - lo) / Math.max(1, n), mag = Math.pow(10, Math.floor(Math.log10(raw))), step = mag * 10;
    [1, 2, 5, 10].some(function (m) { if (m * mag >= raw) { step = m * mag; return true; } return false; });
    var out = [], v = Math.ceil(lo / step - 1e-9) * step;
    while (v <= hi + step * 1e-9 && out.length < 50) { out.push(v); v += step; }
    return out;
  }
  var NS = "http://www.w3.org/2000/svg";
  function zoomable(svg) {
    var d0 = parseFloat(svg.dataset.x0), d1 = parseFloat(svg.dataset.x1), left = parseFloat(svg.dataset.left);
    var pw = parseFloat(svg.dataset.plotwidth), kind = svg.dataset.xkind, plots = svg.querySelectorAll("svg.plot");
    var axis = svg.querySelector("g.xaxis"), view = [0, pw], fmt = kind === "bytes" ? bytes : seconds;
    var base = axis && axis.querySelector("line") ? parseFloat(axis.querySelector("line").getAttribute("y1")) : 0;
    function apply(v0, v1) {
      view = [Math.max(0, v0), Math.min(pw, Math.max(v0 + pw / 1000, v1))];
      plots.forEach(function (p) {
        var vb = p.getAttribute("viewBox").split(" ");
        p.setAttribute("viewBox", view[0] + " " + vb[1] + " " + (view[1] - view[0]) + " " + vb[3]);
      });
      if (!axis) { return; }
      while (axis.firstChild) { axis.removeChild(axis.firstChild); }
      var lo = d0 + (d1 - d0) * view[0] / pw, hi = d0 + (d1 - d0) * view[1] / pw;
      ticks(lo, hi, Math.max(2, Math.floor(pw / 110))).forEach(function (t) {
        var x = left + (t - lo) / (hi - lo) * pw, line = document.createElementNS(NS, "line");
        line.setAttribute("x1", x); line.setAttribute("x2", x); line.setAttribute("y1", base);
        line.setAttribute("y2", base + 4); axis.appendChild(line);
        var label = document.createElementNS(NS, "text");
        label.setAttribute("x", x); label.setAttribute("y", base + 16); label.setAttribute("class", "tick");
        label.setAttribute("text-anchor", "middle"); label.textContent = fmt(t); axis.appendChild(label);
      });
    }
    function toPlot(evt) {
      var r = svg.getBoundingClientRect(), vbw = svg.viewBox.baseVal.width;
      var x = (evt.clientX - r.left) * vbw / r.width - left;
      return view[0] + Math.max(0, Math.min(pw, x)) / pw * (view[1] - view[0]);
    }
    var start = null, brush = null;
    svg.addEventListener("mousedown", function (e) {
      start = toPlot(e); brush = document.createElementNS(NS, "rect"); brush.setAttribute("class", "brush");
      brush.setAttribute("y", 0); brush.setAttribute("height", svg.viewBox.baseVal.height); svg.appendChild(brush);
      e.preventDefault();
    });
    svg.addEventListener("mousemove", function (e) {
      if (start === null) { return; }
      var a = start, b = toPlot(e), s = (view[1] - view[0]) / pw;
      brush.setAttribute("x", left + (Math.min(a, b) - view[0]) / s);
      brush.setAttribute("width", Math.abs(b - a) / s);
    });
    window.addEventListener("mouseup", function (e) {
      if (start === null) { return; }
      var a = start, b = toPlot(e); start = null;
      if (brush) { brush.remove(); brush = null; }
      if (Math.abs(b - a) > pw / 400) { apply(Math.min(a, b), Math.max(a, b)); }
    });
    var bar = document.createElement("div"); bar.className = "zoom-bar";
    [["zoom in", function () { var c = (view[0] + view[1]) / 2, h = (view[1] - view[0]) / 4; apply(c - h, c + h); }],
     ["zoom out", function () { var c = (view[0] + view[1]) / 2, h = view[1] - view[0]; apply(c - h, c + h); }],
     ["reset", function () { apply(0, pw); }]].forEach(function (b) {
      var btn = document.createElement("button"); btn.type = "button"; btn.textContent = b[0];
      btn.addEventListener("click", b[1]); bar.appendChild(btn);
    });
    var box = svg.closest(".chart-box") || svg;
    box.parentNode.insertBefore(bar, box);
  }
  var tip = null, pinned = null;
  function tipText(el) {
    while (el && el.nodeType === 1) {
      if (el.dataset && el.dataset.tip) { return el.dataset.tip; }
      if (el.tagName === "svg" && el.classList.contains("chart")) { return null; }
      el = el.parentNode;
    }
    return null;
  }
  function show(text, x, y) {
    if (!tip) { tip = document.createElement("div"); tip.className = "tip"; tip.setAttribute("role", "status");
      document.body.appendChild(tip); }
    tip.textContent = text; tip.hidden = false;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(window.innerWidth - w - 4, x + 12)) + "px";
    tip.style.top = Math.max(4, Math.min(window.innerHeight - h - 4, y + 12)) + "px";
  }
  function hide() { if (tip && !pinned) { tip.hidden = true; } }
  function tooltips(svg) {
    svg.querySelectorAll("title").forEach(function (t) {
      var p = t.parentNode;
      if (p !== svg) { p.dataset.tip = t.textContent; p.removeChild(t); }
    });
    svg.addEventListener("mousemove", function (e) {
      if (pinned) { return; }
      var text = tipText(e.target);
      if (text) { show(text, e.clientX, e.clientY); } else { hide(); }
    });
    svg.addEventListener("mouseleave", hide);
    svg.addEventListener("click", function (e) {
      var text = tipText(e.target);
      pinned = text && pinned !== e.target ? e.target : null;
      if (text) { show(text, e.clientX, e.clientY); } else { hide(); }
    });
    svg.addEventListener("focusin", function (e) {
      var text = tipText(e.target), r = e.target.getBoundingClientRect();
      if (text) { show(text, r.left, r.bottom); }
    });
    svg.addEventListener("focusout", hide);
  }
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    tooltips(svg);
    if (svg.dataset.zoom === "x") { zoomable(svg); }
  });
  document.documentElement.classList.add("js");
})();
