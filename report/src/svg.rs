//! Small SVG building blocks for the report: linear scales with round
//! ticks, an x/y chart with axes, bands, lines, whiskers and points, a
//! horizontal bar chart, and escaping. No I/O; every function returns
//! markup.

use std::fmt::Write as _;

/// Escapes text for HTML/SVG content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Colour of series `i` (categorical, readable on white).
pub fn colour(i: usize) -> &'static str {
    const PALETTE: [&str; 10] = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
        "#7f7f7f", "#bcbd22",
    ];
    PALETTE[i % PALETTE.len()]
}

/// A linear map from a data domain onto a pixel range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    /// A domain of one value (or none finite) is widened so it maps to the
    /// middle of the range instead of dividing by zero.
    pub fn new(domain: (f64, f64), range: (f64, f64)) -> Scale {
        let (mut d0, mut d1) = domain;
        if !(d0.is_finite() && d1.is_finite()) {
            (d0, d1) = (0.0, 1.0);
        }
        if d0 == d1 {
            let pad = (d0.abs() * 0.05).max(1.0);
            (d0, d1) = (d0 - pad, d1 + pad);
        }
        Scale {
            d0,
            d1,
            r0: range.0,
            r1: range.1,
        }
    }

    /// The domain covering `values` (0..1 when there are none).
    pub fn domain_of(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
        let (lo, hi) = values
            .into_iter()
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if lo > hi { (0.0, 1.0) } else { (lo, hi) }
    }

    pub fn map(&self, v: f64) -> f64 {
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }

    /// Round tick values (1, 2 or 5 × 10ⁿ apart) inside the domain, about `n`.
    pub fn ticks(&self, n: usize) -> Vec<f64> {
        let (lo, hi) = (self.d0.min(self.d1), self.d0.max(self.d1));
        let step = nice_step((hi - lo) / n.max(1) as f64);
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        (first..=last).map(|k| k as f64 * step).collect()
    }
}

fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let m = raw / magnitude;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A value with an SI prefix for axis labels: `12.5 µs` from 12500 ns.
pub fn si(v: f64, unit: &str) -> String {
    let units: &[(f64, &str)] = match unit {
        "ns" => &[(1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns")],
        "ppb" => &[(1e3, "ppm"), (1.0, "ppb")],
        _ => &[(1.0, unit)],
    };
    let a = v.abs();
    let &(div, name) = units
        .iter()
        .find(|(d, _)| a >= *d)
        .unwrap_or(&units[units.len() - 1]);
    let x = v / div;
    let text = format!("{x:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {name}")
}

/// Pixel layout of a chart.
const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 42.0;

/// One x/y chart: scales fixed up front, marks appended, axes on finish.
pub struct Chart {
    pub x: Scale,
    pub y: Scale,
    x_unit: &'static str,
    y_unit: &'static str,
    x_label: String,
    y_label: String,
    /// Label only whole-number x ticks (an x axis that counts things).
    integer_x: bool,
    marks: String,
}

impl Chart {
    /// `x_domain`/`y_domain` in data units; `*_unit` picks the tick labels
    /// (`ns`, `ppb`, `s` or anything else printed as is).
    pub fn new(
        (x_domain, x_unit, x_label): ((f64, f64), &'static str, &str),
        (y_domain, y_unit, y_label): ((f64, f64), &'static str, &str),
    ) -> Chart {
        Chart {
            x: Scale::new(x_domain, (LEFT, WIDTH - RIGHT)),
            y: Scale::new(y_domain, (HEIGHT - BOTTOM, TOP)),
            x_unit,
            y_unit,
            x_label: x_label.into(),
            y_label: y_label.into(),
            integer_x: false,
            marks: String::new(),
        }
    }

    /// Only whole-number x ticks: for an x axis of indices (instance 0,
    /// 1, …), where 0.25 would name nothing.
    pub fn integer_x(mut self) -> Chart {
        self.integer_x = true;
        self
    }

    /// A vertical whisker at `x` from `lo` to `hi`, with short caps (an
    /// interval such as value ± bound).
    pub fn whisker(&mut self, x: f64, (lo, hi): (f64, f64), colour: &str) {
        let (px, plo, phi) = (self.x.map(x), self.y.map(lo), self.y.map(hi));
        let _ = writeln!(
            self.marks,
            r#"<path class="whisker" d="M{:.2},{plo:.2}H{:.2}M{px:.2},{plo:.2}V{phi:.2}M{:.2},{phi:.2}H{:.2}" fill="none" stroke="{colour}" stroke-width="1.3"/>"#,
            px - 3.0,
            px + 3.0,
            px - 3.0,
            px + 3.0
        );
    }

    /// A filled band between `lo` and `hi` along x (points sorted by x).
    pub fn band(&mut self, points: &[(f64, f64, f64)], colour: &str) {
        if points.is_empty() {
            return;
        }
        let upper = points.iter().map(|&(x, _, hi)| (x, hi));
        let lower = points.iter().rev().map(|&(x, lo, _)| (x, lo));
        let d = self.coords(upper.chain(lower));
        let _ = writeln!(
            self.marks,
            r#"<polygon class="band" points="{d}" fill="{colour}" fill-opacity="0.18" stroke="none"/>"#
        );
    }

    /// A line through `points` (sorted by x).
    pub fn line(&mut self, points: &[(f64, f64)], colour: &str) {
        if points.len() < 2 {
            return;
        }
        let d = self.coords(points.iter().copied());
        let _ = writeln!(
            self.marks,
            r#"<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#
        );
    }

    /// A point whose exact values travel in `attrs` (already escaped
    /// `data-*` attributes) and in a `<title>` tooltip.
    pub fn point(&mut self, (x, y): (f64, f64), colour: &str, attrs: &str, title: &str) {
        let _ = writeln!(
            self.marks,
            r#"<circle {attrs} cx="{:.2}" cy="{:.2}" r="3" fill="{colour}"><title>{}</title></circle>"#,
            self.x.map(x),
            self.y.map(y),
            escape(title)
        );
    }

    /// A horizontal reference line at `y` (e.g. zero error).
    pub fn rule(&mut self, y: f64) {
        let py = self.y.map(y);
        let _ = writeln!(
            self.marks,
            r##"<line x1="{LEFT}" x2="{}" y1="{py:.2}" y2="{py:.2}" stroke="#444" stroke-dasharray="4 3"/>"##,
            WIDTH - RIGHT
        );
    }

    fn coords(&self, points: impl Iterator<Item = (f64, f64)>) -> String {
        let mut d = String::new();
        for (x, y) in points {
            let _ = write!(d, "{:.2},{:.2} ", self.x.map(x), self.y.map(y));
        }
        d.trim_end().to_string()
    }

    /// The finished `<svg>`: grid, tick labels, axis titles and the marks.
    pub fn finish(self, class: &str) -> String {
        let mut s = format!(
            r#"<svg class="chart {class}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">"#
        );
        s.push('\n');
        s.push_str(&self.axes());
        s.push_str(&self.marks);
        s.push_str("</svg>\n");
        s
    }

    fn axes(&self) -> String {
        let mut s = String::new();
        let (bottom, right) = (HEIGHT - BOTTOM, WIDTH - RIGHT);
        for t in self.y.ticks(6) {
            let py = self.y.map(t);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{right}" y1="{py:.2}" y2="{py:.2}" stroke="#e3e3e3"/><text x="{}" y="{:.2}" text-anchor="end" class="tick">{}</text>"##,
                LEFT - 6.0,
                py + 4.0,
                escape(&si(t, self.y_unit))
            );
        }
        let x_ticks = self.x.ticks(8);
        for t in x_ticks
            .into_iter()
            .filter(|t| !self.integer_x || t.fract() == 0.0)
        {
            let px = self.x.map(t);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.2}" x2="{px:.2}" y1="{TOP}" y2="{bottom}" stroke="#eeeeee"/><text x="{px:.2}" y="{}" text-anchor="middle" class="tick">{}</text>"##,
                bottom + 16.0,
                escape(&si(t, self.x_unit))
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
            right - LEFT,
            bottom - TOP
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" class="axis">{}</text><text transform="translate(14 {}) rotate(-90)" text-anchor="middle" class="axis">{}</text>"#,
            (LEFT + right) / 2.0,
            HEIGHT - 6.0,
            escape(&self.x_label),
            (TOP + bottom) / 2.0,
            escape(&self.y_label)
        );
        s
    }
}

/// Pixel layout of a bar chart: names on the left, notes after the bars.
const BAR_LEFT: f64 = 230.0;
const BAR_RIGHT: f64 = 250.0;
const BAR_ROW: f64 = 24.0;
const BAR_HEIGHT: f64 = 16.0;

/// Horizontal bars from 0, one row each, on a value axis at the bottom.
pub struct Bars {
    x: Scale,
    unit: &'static str,
    label: String,
    rows: Vec<String>,
}

impl Bars {
    /// Bars of values in `0..=max` (`unit` picks the tick labels as in
    /// [`Chart::new`]).
    pub fn new(max: f64, unit: &'static str, label: &str) -> Bars {
        let max = if max.is_finite() && max > 0.0 {
            max
        } else {
            1.0
        };
        Bars {
            x: Scale::new((0.0, max), (BAR_LEFT, WIDTH - BAR_RIGHT)),
            unit,
            label: label.into(),
            rows: Vec::new(),
        }
    }

    /// One row: `name` on the left, a bar of `value` whose exact values
    /// travel in `attrs` (already escaped `data-*` attributes) and in a
    /// `<title>`, and `note` after it.
    pub fn bar(
        &mut self,
        name: &str,
        value: f64,
        colour: &str,
        attrs: &str,
        title: &str,
        note: &str,
    ) {
        let y = TOP + self.rows.len() as f64 * BAR_ROW;
        let end = self.x.map(value.max(0.0));
        self.rows.push(format!(
            r#"<text x="{:.2}" y="{:.2}" text-anchor="end" class="tick">{}</text><rect {attrs} x="{BAR_LEFT}" y="{y:.2}" width="{:.2}" height="{BAR_HEIGHT}" fill="{colour}"><title>{}</title></rect><text x="{:.2}" y="{:.2}" class="tick">{}</text>"#,
            BAR_LEFT - 6.0,
            y + 12.0,
            escape(name),
            end - BAR_LEFT,
            escape(title),
            end + 6.0,
            y + 12.0,
            escape(note)
        ));
    }

    /// The finished `<svg>`: the bars, a value axis with its grid, and
    /// its title.
    pub fn finish(self, class: &str) -> String {
        let bottom = TOP + self.rows.len().max(1) as f64 * BAR_ROW;
        let height = bottom + BOTTOM;
        let right = WIDTH - BAR_RIGHT;
        let mut s = format!(
            r#"<svg class="bars {class}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}">"#
        );
        s.push('\n');
        for t in self.x.ticks(6) {
            let px = self.x.map(t);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.2}" x2="{px:.2}" y1="{TOP}" y2="{bottom}" stroke="#e3e3e3"/><text x="{px:.2}" y="{}" text-anchor="middle" class="tick">{}</text>"##,
                bottom + 16.0,
                escape(&si(t, self.unit))
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{BAR_LEFT}" x2="{BAR_LEFT}" y1="{TOP}" y2="{bottom}" stroke="#888"/><text x="{}" y="{}" text-anchor="middle" class="axis">{}</text>"##,
            (BAR_LEFT + right) / 2.0,
            height - 6.0,
            escape(&self.label)
        );
        for r in self.rows {
            s.push_str(&r);
            s.push('\n');
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<n&1 "x" 'y'>"#),
            "&lt;n&amp;1 &quot;x&quot; &#39;y&#39;&gt;"
        );
        assert_eq!(escape("n0"), "n0");
    }

    #[test]
    fn scales_map_ends_and_survive_degenerate_domains() {
        let s = Scale::new((10.0, 20.0), (100.0, 0.0));
        assert_eq!((s.map(10.0), s.map(20.0), s.map(15.0)), (100.0, 0.0, 50.0));
        let flat = Scale::new((5.0, 5.0), (0.0, 100.0));
        assert_eq!(flat.map(5.0), 50.0, "one value sits in the middle");
        let none = Scale::new(Scale::domain_of([]), (0.0, 10.0));
        assert!(none.map(0.5).is_finite());
        assert_eq!(Scale::domain_of([3.0, f64::NAN, -1.0, 2.0]), (-1.0, 3.0));
    }

    #[test]
    fn ticks_are_round_and_inside_the_domain() {
        let s = Scale::new((-1_234.0, 98_765.0), (0.0, 1.0));
        let t = s.ticks(5);
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.iter().all(|v| (-1_234.0..=98_765.0).contains(v)), "{t:?}");
        assert!(t.windows(2).all(|w| w[1] - w[0] == 20_000.0), "{t:?}");
        assert_eq!(
            Scale::new((0.0, 1e-3), (0.0, 1.0)).ticks(4).len(),
            3,
            "steps of 2.5e-4 round up to 5e-4"
        );
    }

    #[test]
    fn si_labels_pick_the_unit() {
        assert_eq!(si(12_500.0, "ns"), "12.5 µs");
        assert_eq!(si(-2_000_000.0, "ns"), "-2 ms");
        assert_eq!(si(0.0, "ns"), "0 ns");
        assert_eq!(si(15_000.0, "ppb"), "15 ppm");
        assert_eq!(si(3.0, "s"), "3 s");
    }

    #[test]
    fn a_chart_places_points_inside_its_frame() {
        let mut c = Chart::new(((0.0, 10.0), "s", "time"), ((-5.0, 5.0), "ns", "offset"));
        c.point((10.0, 5.0), colour(0), r#"data-v="5""#, "<5>");
        let svg = c.finish("t");
        assert!(
            svg.contains(r#"<circle data-v="5" cx="940.00" cy="14.00""#),
            "{svg}"
        );
        assert!(svg.contains("<title>&lt;5&gt;</title>"), "{svg}");
    }

    #[test]
    fn whiskers_span_their_interval_and_integer_axes_name_whole_numbers() {
        let mut c =
            Chart::new(((-0.5, 2.5), "", "instance"), ((0.0, 100.0), "ns", "ns")).integer_x();
        c.whisker(1.0, (20.0, 60.0), colour(1));
        let y = |v: f64| format!("{:.2}", c.y.map(v));
        let (lo, hi) = (y(20.0), y(60.0));
        let svg = c.finish("w");
        assert!(
            svg.contains(&format!("V{hi}")) && svg.contains(&format!(",{lo}H")),
            "{svg}"
        );
        let labels: Vec<&str> = svg
            .split("class=\"tick\">")
            .skip(1)
            .map(|t| t.split('<').next().unwrap())
            .collect();
        assert!(
            labels.contains(&"1 ") && !labels.iter().any(|l| l.contains('.')),
            "{labels:?}"
        );
    }

    #[test]
    fn bars_grow_from_zero_in_rows_with_their_values() {
        let mut b = Bars::new(2_000.0, "ns", "wait caused");
        b.bar(
            "rank 0 <a>",
            2_000.0,
            colour(4),
            r#"data-v="2000""#,
            "t",
            "last 3×",
        );
        b.bar("rank 1", 0.0, colour(4), r#"data-v="0""#, "t", "last 0×");
        let svg = b.finish("x");
        let full = WIDTH - BAR_RIGHT - BAR_LEFT;
        assert!(
            svg.contains(&format!(
                r#"<rect data-v="2000" x="{BAR_LEFT}" y="{TOP:.2}" width="{full:.2}""#
            )),
            "{svg}"
        );
        assert!(
            svg.contains(r#"<rect data-v="0" x="230" y="38.00" width="0.00""#),
            "{svg}"
        );
        assert!(svg.contains("rank 0 &lt;a&gt;") && svg.contains(">last 3×<"));
        assert!(svg.contains(&format!(r#"height="{}""#, TOP + 2.0 * BAR_ROW + BOTTOM)));
        assert!(
            Bars::new(0.0, "ns", "none").finish("e").contains("<svg"),
            "an all-zero chart still draws"
        );
    }
}
