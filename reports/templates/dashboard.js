// Draws the plotly figures whose JSON sits in the page's application/json script blocks
// (id "fig-" + name), and filters the tables. No network: plotly is inlined above this script.
(function () {
  "use strict";
  var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"]};

  function drawFigures() {
    var targets = document.querySelectorAll("[data-figure]");
    var pending = [];
    targets.forEach(function (el) {
      var source = document.getElementById("fig-" + el.dataset.figure);
      var fig = JSON.parse(source.textContent);
      if (!fig.data.length || (fig.data[0].type === "heatmap" && !fig.data[0].z.length)) {
        el.textContent = "Nothing to show yet.";
        el.classList.add("empty");
        return;
      }
      pending.push(Plotly.newPlot(el, fig.data, fig.layout, config));
    });
    Promise.all(pending).then(function () {
      document.body.dataset.figuresDrawn = String(pending.length);
    }, function (err) {
      document.body.dataset.figuresDrawn = "error";
      console.error("figure failed", err);
    });
  }

  function wireFilters() {
    document.querySelectorAll("input[data-filter]").forEach(function (input) {
      var table = document.getElementById(input.dataset.filter);
      input.addEventListener("input", function () {
        var needle = input.value.toLowerCase();
        table.querySelectorAll("tbody tr").forEach(function (row) {
          row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0;
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    wireFilters();
    drawFigures();
  });
})();
