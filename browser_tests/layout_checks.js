// Layout checks run inside the page (used by browser_tests/test_pages.py and by hand).
// textBoxOverlaps(plot): pairs of text boxes of one plotly figure whose rectangles intersect:
//   the legend, the slider's current-value label, the slider's step labels (as one box), every
//   annotation, the figure title and the axis titles.
// tickOrder(plot): axes whose tick labels, read in the order drawn, are not monotone in value
//   (plotly's minor log labels "2 5 2 100" are what this catches).
// overflowingElements(column): elements that stick out of the reading column without a scrolling
//   ancestor inside it to hold them.
(() => {
  function rect(el) {
    const r = el.getBoundingClientRect();
    return r.width > 0.5 && r.height > 0.5 ? {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom} : null;
  }
  function union(els) {
    const rs = els.map(rect).filter(Boolean);
    if (!rs.length) return null;
    return {x0: Math.min(...rs.map(r => r.x0)), y0: Math.min(...rs.map(r => r.y0)),
            x1: Math.max(...rs.map(r => r.x1)), y1: Math.max(...rs.map(r => r.y1))};
  }
  function boxes(plot) {
    const out = [];
    const add = (name, r) => { if (r) out.push({name, r}); };
    plot.querySelectorAll('g.legend').forEach((g, i) => add(`legend ${i}`, rect(g.querySelector('rect.bg') || g)));
    plot.querySelectorAll('g.slider-container').forEach((g, i) => {
      g.querySelectorAll('.slider-current-value').forEach(t => add(`slider ${i} value label`, rect(t)));
      add(`slider ${i} step labels`, union([...g.querySelectorAll('.slider-label')]));
    });
    plot.querySelectorAll('g.annotation').forEach((g, i) => {
      if (!(g.textContent || '').trim()) return;  // an arrow without text (e.g. a diagram's edge)
      const t = g.querySelector('g.annotation-text-g') || g;
      add(`annotation ${i} "${(g.textContent || '').slice(0, 30)}"`, rect(t));
    });
    plot.querySelectorAll('g.g-gtitle text').forEach(t => add('title', rect(t)));
    plot.querySelectorAll('[class*="title"] > text.xtitle, [class*="title"] > text.ytitle, text.xtitle, text.ytitle, text[class^="x"][class$="title"], text[class^="y"][class$="title"]')
      .forEach(t => add(`axis title "${t.textContent.slice(0, 20)}"`, rect(t)));
    const seen = new Set();
    return out.filter(b => { const k = b.name + JSON.stringify(b.r); if (seen.has(k)) return false; seen.add(k); return true; });
  }
  function overlap(a, b, tol) {
    return Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0) > tol && Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) > tol;
  }
  window.servelabTextBoxOverlaps = (plot, tol = 1) => {
    const bs = boxes(plot), hits = [];
    for (let i = 0; i < bs.length; i++)
      for (let j = i + 1; j < bs.length; j++)
        if (overlap(bs[i].r, bs[j].r, tol)) hits.push(`${bs[i].name} overlaps ${bs[j].name}`);
    return hits;
  };
  const SI = {k: 1e3, M: 1e6, G: 1e9, T: 1e12, m: 1e-3, 'µ': 1e-6, n: 1e-9};
  function tickValue(label) {
    const s = label.replace(/[−–]/g, '-').replace(/[,\s]/g, '').replace(/%$/, '');
    const m = s.match(/^(-?\d*\.?\d+(?:e[-+]?\d+)?)([kMGTmµn]?)$/);
    return m ? parseFloat(m[1]) * (m[2] ? SI[m[2]] : 1) : null;
  }
  window.servelabTickOrder = (plot) => {
    const hits = [];
    plot.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above').forEach((layer, i) => {
      const labels = [...layer.querySelectorAll('text')].map(t => t.textContent.trim()).filter(Boolean);
      const values = labels.map(tickValue);
      if (labels.length < 3 || values.some(v => v === null)) return;  // a category or date axis
      const steps = values.slice(1).map((v, k) => Math.sign(v - values[k])).filter(d => d !== 0);
      if (steps.some(d => d !== steps[0]))
        hits.push(`axis ${i} (${layer.getAttribute('class')}): ${labels.join(' ')}`);
    });
    return hits;
  };
  function scrollsX(el) {
    const s = getComputedStyle(el).overflowX;
    return s === 'auto' || s === 'scroll' || s === 'hidden' || s === 'clip';
  }
  window.servelabOverflowing = (column, tol = 2) => {
    const c = column.getBoundingClientRect(), hits = [];
    for (const el of column.querySelectorAll('*')) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.right <= c.right + tol) continue;
      let held = false;
      for (let a = el.parentElement; a && a !== column; a = a.parentElement)
        if (scrollsX(a) && a.getBoundingClientRect().right <= c.right + tol) { held = true; break; }
      if (held) continue;
      if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;  // judged by its svg
      const label = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
        (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : '');
      hits.push(`${label} is ${Math.round(r.right - c.right)} px wider than its column`);
      if (hits.length > 20) break;
    }
    return hits;
  };
})();
