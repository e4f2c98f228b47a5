// The report's tables: drawn from the JSON in #report-data (ddlbench/report/tables.py says how it is
// encoded), sortable by a click on a heading (by the figure's value, not its text), paginated and
// filtered. Tables already in the page (class "sortable") get the same sorting. Every value is set as
// text (textContent), never as markup: names come from configs and records.
(function () {
  "use strict";
  var source = document.getElementById("report-data");
  var DATA = source ? JSON.parse(source.textContent) : {};
  var decoded = {};

  // a column as a plain array of `length` values, from any of the spellings tables.py writes
  function expand(encoded, length) {
    if (Array.isArray(encoded)) return encoded;
    var out;
    if ("all" in encoded) {
      out = new Array(length);
      out.fill(encoded.all);
      return out;
    }
    if (encoded.at) {
      out = new Array(length);
      out.fill("mostly" in encoded ? encoded.mostly : null);
      var found = expand(encoded.values, encoded.at.length);
      encoded.at.forEach(function (row, k) { out[row] = found[k]; });
      return out;
    }
    if (encoded.runs) {
      out = [];
      for (var r = 0; r < encoded.runs.length; r += 2) {
        var value = encoded.runs[r] === null ? null : encoded.values[encoded.runs[r]];
        for (var k = 0; k < encoded.runs[r + 1]; k++) out.push(value);
      }
      return out;
    }
    if (encoded.codes) {
      return encoded.codes.map(function (code) { return code === null ? null : encoded.values[code]; });
    }
    out = [];
    var previous = "";
    for (var i = 0; i < encoded.shared.length; i++) {
      if (encoded.shared[i] < 0) { out.push(null); continue; }
      previous = previous.slice(0, encoded.shared[i]) + encoded.rest[i];
      out.push(previous);
    }
    return out;
  }

  function table(name) {
    if (!decoded[name]) {
      var raw = DATA[name];
      var length = raw.length;
      var columns = {};
      raw.columns.forEach(function (column) {
        var values = raw.data[column.key];
        if (column.kind === "figure") {
          values = {
            m: expand(values.m, length), lo: expand(values.lo, length), hi: expand(values.hi, length),
            n: Array.isArray(values.n) && !values.n.length ? [] : expand(values.n, length),
            noisy: expand(values.noisy, length), unit: values.unit
          };
        } else {
          values = expand(values, length);
        }
        columns[column.key] = Object.assign({ values: values }, column);
      });
      decoded[name] = { columns: columns, length: length, notes: raw.data._notes ? expand(raw.data._notes, length) : null };
    }
    return decoded[name];
  }

  function missing(value) { return value === null || value === undefined || value === ""; }
  function fmt(value) { return missing(value) ? "" : String(value); }

  // "123.4 [118, 127.9] n=20 steps", as ddlbench.report.figures.interval_text writes it
  function figureText(figure, i) {
    var median = figure.m[i];
    if (missing(median)) return "";
    var n = figure.n.length ? figure.n[i] : null;
    var count = "";
    if (!missing(n)) {
      var unit = n === 1 && /s$/.test(figure.unit) ? figure.unit.slice(0, -1) : figure.unit;
      count = " n=" + n + " " + unit;
    }
    if (missing(figure.lo[i]) || missing(figure.hi[i])) return fmt(median) + count + (count ? " (no 95 % CI: n < 6)" : "");
    return fmt(median) + " [" + fmt(figure.lo[i]) + ", " + fmt(figure.hi[i]) + "]" + count;
  }

  function addFlag(cell, text, kind) {
    var span = document.createElement("span");
    span.className = "flag " + kind;
    span.textContent = text;
    cell.appendChild(span);
  }

  function cellOf(data, column, i) {
    var cell = document.createElement("td");
    var value = column.values;
    if (column.kind === "figure") {
      cell.textContent = figureText(value, i);
      if (cell.textContent && value.noisy[i] && !missing(value.lo[i])) addFlag(cell, "noisy", "flag-noisy");
      if (column.notes && data.notes && data.notes[i] && cell.textContent) {
        data.notes[i].split(";").forEach(function (note) { addFlag(cell, note, "flag-note"); });
      }
    } else if (column.kind === "link") {
      if (value[i]) {
        var link = document.createElement("a");
        link.textContent = "trace";
        link.title = value[i];
        if (!/^[a-z][a-z0-9+.-]*:/i.test(value[i])) link.setAttribute("href", value[i]); // relative paths only
        cell.appendChild(link);
      }
    } else if (column.kind === "text") {
      cell.className = column.key === "point_id" ? "text id" : "text";
      cell.textContent = fmt(value[i]);
      if (column.key === "status") cell.classList.add("status", "status-" + fmt(value[i]).replace(/[^a-z]/g, ""));
    } else {
      cell.textContent = fmt(value[i]);
    }
    return cell;
  }

  function sortValue(column, i) {
    return column.kind === "figure" ? column.values.m[i] : column.values[i];
  }

  // missing values last in either direction; numbers as numbers, text with its digits as numbers
  function compare(a, b, direction) {
    var aMissing = missing(a), bMissing = missing(b);
    if (aMissing || bMissing) return aMissing === bMissing ? 0 : aMissing ? 1 : -1;
    if (typeof a === "number" && typeof b === "number") return (a - b) * direction;
    return String(a).localeCompare(String(b), undefined, { numeric: true }) * direction;
  }

  function markSorted(heading, direction) {
    Array.prototype.forEach.call(heading.parentNode.children, function (other) { other.removeAttribute("aria-sort"); });
    heading.setAttribute("aria-sort", direction > 0 ? "ascending" : "descending");
  }

  function button(text) {
    var element = document.createElement("button");
    element.type = "button";
    element.textContent = text;
    return element;
  }

  function dataTable(host) {
    var data = table(host.dataset.table);
    var columns = host.dataset.columns.split(" ").filter(function (key) { return data.columns[key]; })
      .map(function (key) { return data.columns[key]; });
    var start = Number(host.dataset.start || 0);
    var stop = host.dataset.stop ? Number(host.dataset.stop) : data.length;
    var size = Number(host.dataset.page || 25);
    var all = [];
    for (var i = start; i < stop; i++) all.push(i);
    var rows = all.slice();
    var page = 0;
    var sorted = null;
    var texts = {};

    var controls = document.createElement("div");
    controls.className = "controls";
    var filter = document.createElement("input");
    filter.type = "search";
    filter.placeholder = "filter rows";
    filter.setAttribute("aria-label", "filter rows");
    var previous = button("◀ previous");
    var next = button("next ▶");
    var info = document.createElement("span");
    controls.append(filter, previous, next, info);
    var scroll = document.createElement("div");
    scroll.className = "scroll";
    var element = document.createElement("table");
    element.className = "data";
    var heads = element.createTHead().insertRow();
    columns.forEach(function (column) {
      var heading = document.createElement("th");
      heading.textContent = column.title;
      if (column.about) heading.title = column.about;
      heading.tabIndex = 0;
      heading.addEventListener("click", function () { sortBy(column, heading); });
      heading.addEventListener("keydown", function (event) { if (event.key === "Enter") sortBy(column, heading); });
      heads.appendChild(heading);
    });
    var body = element.createTBody();
    scroll.appendChild(element);
    host.append(controls, scroll);

    function rowText(i) {
      if (!(i in texts)) {
        texts[i] = columns.map(function (column) {
          return column.kind === "figure" ? figureText(column.values, i) : fmt(column.values[i]);
        }).join(" ").toLowerCase();
      }
      return texts[i];
    }

    function order() {
      if (!sorted) return;
      var column = sorted.column, direction = sorted.direction;
      rows.sort(function (a, b) { return compare(sortValue(column, a), sortValue(column, b), direction) || a - b; });
    }

    function sortBy(column, heading) {
      var direction = sorted && sorted.column === column ? -sorted.direction : 1;
      sorted = { column: column, direction: direction };
      markSorted(heading, direction);
      order();
      page = 0;
      draw();
    }

    function draw() {
      var pages = Math.max(1, Math.ceil(rows.length / size));
      page = Math.min(page, pages - 1);
      var first = page * size;
      var fragment = document.createDocumentFragment();
      rows.slice(first, first + size).forEach(function (i) {
        var row = document.createElement("tr");
        columns.forEach(function (column) { row.appendChild(cellOf(data, column, i)); });
        fragment.appendChild(row);
      });
      body.replaceChildren(fragment);
      info.textContent = rows.length
        ? "rows " + (first + 1) + "–" + Math.min(first + size, rows.length) + " of " + rows.length
          + (rows.length < all.length ? " (filtered from " + all.length + ")" : "")
        : "no rows";
      previous.disabled = page === 0;
      next.disabled = page >= pages - 1;
      controls.hidden = all.length <= size && !filter.value;
    }

    previous.addEventListener("click", function () { page -= 1; draw(); });
    next.addEventListener("click", function () { page += 1; draw(); });
    filter.addEventListener("input", function () {
      var query = filter.value.trim().toLowerCase();
      rows = query ? all.filter(function (i) { return rowText(i).indexOf(query) >= 0; }) : all.slice();
      order();
      page = 0;
      draw();
    });
    draw();
  }

  // tables written into the page: sort their body rows by a cell's data-v (a number) or its text
  function sortable(element) {
    var headings = element.tHead ? element.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headings, function (heading, index) {
      var direction = -1;
      heading.tabIndex = 0;
      function sort() {
        direction = -direction;
        markSorted(heading, direction);
        var body = element.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        function key(row) {
          var cell = row.cells[index];
          if (!cell) return null;
          if (cell.dataset.v !== undefined) return cell.dataset.v === "" ? null : Number(cell.dataset.v);
          return cell.textContent.trim();
        }
        rows.sort(function (a, b) { return compare(key(a), key(b), direction); });
        rows.forEach(function (row) { body.appendChild(row); });
      }
      heading.addEventListener("click", sort);
      heading.addEventListener("keydown", function (event) { if (event.key === "Enter") sort(); });
    });
  }

  Array.prototype.forEach.call(document.querySelectorAll("div.datatable"), dataTable);
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), sortable);
})();
