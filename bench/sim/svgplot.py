"""Line charts as SVG text (Python standard library only): the scale model's plots."""
import math

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
DASHES = ["", "6,3", "2,3", "8,3,2,3"]


def _esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ticks_log(lo, hi):
    out, e = [], math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo / 1.0001 <= v <= hi * 1.0001:
                out.append(v)
        e += 1
    return out


def _fmt(v):
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


def panel(x0, y0, w, h, title, series, xlabel, ylabel, xlog2=True, ylog=False, ylim=None):
    """One chart at (x0, y0) of size w × h: `series` is a list of (label, color index,
    dash index, [(x, y), ...]). Returns SVG elements."""
    xs = [x for _, _, _, pts in series for x, _ in pts]
    ys = [y for _, _, _, pts in series for _, y in pts if y is not None and y > 0]
    xlo, xhi = min(xs), max(xs)
    if ylim:
        ylo, yhi = ylim
    else:
        ylo, yhi = min(ys), max(ys)
        if ylog:
            ylo, yhi = 10 ** math.floor(math.log10(ylo)), 10 ** math.ceil(math.log10(yhi))
    left, right, top, bottom = 60, 10, 28, 40
    pw, ph = w - left - right, h - top - bottom

    def fx(x):
        if xlog2:
            return x0 + left + pw * (math.log2(x) - math.log2(xlo)) / max(1e-12, math.log2(xhi) - math.log2(xlo))
        return x0 + left + pw * (x - xlo) / max(1e-12, xhi - xlo)

    def fy(y):
        if ylog:
            return y0 + top + ph * (1 - (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)))
        return y0 + top + ph * (1 - (y - ylo) / max(1e-12, yhi - ylo))

    el = [f'<text x="{x0 + left + pw / 2:.1f}" y="{y0 + 18}" text-anchor="middle" font-size="13" '
          f'font-weight="bold">{_esc(title)}</text>',
          f'<rect x="{x0 + left}" y="{y0 + top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    xt = sorted(set(xs))
    for x in xt:
        el.append(f'<line x1="{fx(x):.1f}" y1="{y0 + top}" x2="{fx(x):.1f}" y2="{y0 + top + ph}" stroke="#ddd"/>')
        el.append(f'<text x="{fx(x):.1f}" y="{y0 + top + ph + 14}" text-anchor="middle" font-size="10">{_fmt(x)}</text>')
    yt = _ticks_log(ylo, yhi) if ylog else [ylo + (yhi - ylo) * i / 5 for i in range(6)]
    for y in yt:
        el.append(f'<line x1="{x0 + left}" y1="{fy(y):.1f}" x2="{x0 + left + pw}" y2="{fy(y):.1f}" stroke="#eee"/>')
        el.append(f'<text x="{x0 + left - 4}" y="{fy(y) + 3:.1f}" text-anchor="end" font-size="10">{_fmt(y)}</text>')
    el.append(f'<text x="{x0 + left + pw / 2:.1f}" y="{y0 + h - 6}" text-anchor="middle" font-size="11">'
              f'{_esc(xlabel)}</text>')
    el.append(f'<text x="{x0 + 14}" y="{y0 + top + ph / 2:.1f}" text-anchor="middle" font-size="11" '
              f'transform="rotate(-90 {x0 + 14} {y0 + top + ph / 2:.1f})">{_esc(ylabel)}</text>')
    for label, ci, di, pts in series:
        pts = [(x, y) for x, y in pts if y is not None and y > 0]
        if not pts:
            continue
        path = " ".join(f"{fx(x):.1f},{fy(min(max(y, ylo), yhi)):.1f}" for x, y in pts)
        dash = f' stroke-dasharray="{DASHES[di % len(DASHES)]}"' if DASHES[di % len(DASHES)] else ""
        el.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[ci % len(COLORS)]}" stroke-width="1.8"'
                  f'{dash}/>')
        for x, y in pts:
            el.append(f'<circle cx="{fx(x):.1f}" cy="{fy(min(max(y, ylo), yhi)):.1f}" r="2.2" '
                      f'fill="{COLORS[ci % len(COLORS)]}"/>')
    return el


def legend(x0, y0, entries):
    """Entries (label, color index, dash index) in one column."""
    el = []
    for i, (label, ci, di) in enumerate(entries):
        y = y0 + 16 * i
        dash = f' stroke-dasharray="{DASHES[di % len(DASHES)]}"' if DASHES[di % len(DASHES)] else ""
        el.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + 24}" y2="{y}" stroke="{COLORS[ci % len(COLORS)]}" '
                  f'stroke-width="2"{dash}/>')
        el.append(f'<text x="{x0 + 30}" y="{y + 4}" font-size="11">{_esc(label)}</text>')
    return el


def document(width, height, elements, title):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n<title>{_esc(title)}</title>\n'
            f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(elements) + "\n</svg>\n")
