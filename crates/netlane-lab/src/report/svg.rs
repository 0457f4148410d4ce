//! Charts as SVG (plotters), from the report's [`Chart`] data.
//!
//! - category charts (bars, dots) are drawn horizontally: one band per category, its
//!   name on the left, so long mode names never collide; bars only on linear axes
//!   (a bar's length means nothing on a log axis), dots with error bars otherwise;
//! - line charts over a numeric (optionally logarithmic) or ordered category x axis;
//! - percentile plots on a "nines" x axis (50, 90, 99, 99.9, 99.99 evenly spaced), as
//!   HDR histogram plots do;
//! - the legend sits in its own panel right of the plot, never over the data; tick
//!   labels are human (`250 µs`, `1.2M`); error bars show the range of the repeats.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged, ValueFormatter};
use plotters::prelude::*;

use netlane_report::format;
use netlane_report::{Chart, ChartKind, Scale, Series, Unit};

const WIDTH: u32 = 960;
const FONT: &str = "sans-serif";
/// Okabe-Ito (distinguishable with every common colour-vision deficiency), then Paul
/// Tol's muted scheme: sixteen colours, so a chart of up to sixteen series repeats none.
const PALETTE: [RGBColor; 16] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(51, 34, 136),
    RGBColor(136, 204, 238),
    RGBColor(68, 170, 153),
    RGBColor(17, 119, 51),
    RGBColor(153, 153, 51),
    RGBColor(221, 204, 119),
    RGBColor(204, 102, 119),
    RGBColor(136, 34, 85),
    RGBColor(170, 68, 153),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

type DrawResult<T> = Result<T, String>;

/// A linear f64 axis whose ticks sit exactly at `keys` (category centres, percentile
/// ranks), so the label formatter is asked about those values only.
#[derive(Debug, Clone)]
struct Keyed {
    range: Range<f64>,
    keys: Vec<f64>,
}

impl Ranged for Keyed {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let t = if span == 0.0 { 0.0 } else { (v - self.range.start) / span };
        limit.0 + (t * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.keys.clone()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Approximate width of `s` in pixels at `size` (no font metrics in an SVG backend).
fn text_width(s: &str, size: u32) -> u32 {
    (s.chars().count() as u32 * size * 55 / 100).max(1)
}

/// Width of the legend panel for these series.
fn legend_width(series: &[Series]) -> u32 {
    let longest = series.iter().map(|s| text_width(&s.name, 13)).max().unwrap_or(0);
    (longest + 44).clamp(120, 320)
}

/// Draws the legend (a swatch and a name per series) into its own panel.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
    lines: bool,
) -> DrawResult<()> {
    for (i, s) in series.iter().enumerate() {
        let y = 50 + i as i32 * 22;
        let c = color(i);
        if lines {
            area.draw(&PathElement::new(vec![(8, y), (30, y)], c.stroke_width(3))).map_err(err)?;
            area.draw(&Circle::new((19, y), 4, c.filled())).map_err(err)?;
        } else {
            area.draw(&Rectangle::new([(10, y - 6), (28, y + 6)], c.filled())).map_err(err)?;
        }
        area.draw(&Text::new(s.name.clone(), (38, y - 7), (FONT, 13).into_font())).map_err(err)?;
    }
    Ok(())
}

/// Range of all finite values (lows and highs included), widened for the scale.
fn value_range(series: &[Series], log: bool, from_zero: bool) -> (f64, f64) {
    let vals: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|p| [Some(p.y), p.low, p.high]))
        .flatten()
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        decades(lo / 1.6, (hi * 1.6).max(lo * 2.0))
    } else if from_zero || lo >= 0.0 {
        (0.0, if hi > 0.0 { hi * 1.12 } else { 1.0 })
    } else {
        let pad = (hi - lo).abs().max(1e-9) * 0.1;
        (lo - pad, hi + pad)
    }
}

/// Every x value of every series, in order, once.
fn chart_xs(series: &[Series]) -> Vec<f64> {
    let mut xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).filter(|x| x.is_finite()).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs
}

/// `pts` (in x order) cut where they skip one of the chart's `xs`.
fn runs<'a>(pts: &'a [(f64, f64)], xs: &[f64]) -> Vec<&'a [(f64, f64)]> {
    let rank = |x: f64| xs.iter().position(|v| *v == x);
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=pts.len() {
        let joined = i < pts.len() && matches!((rank(pts[i - 1].0), rank(pts[i].0)), (Some(a), Some(b)) if b == a + 1);
        if !joined {
            out.push(&pts[start..i]);
            start = i;
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

/// A log axis's range widened to whole decades: plotters labels a log axis at powers of
/// ten only, so a range inside one decade (200 to 500) would show no tick label at all.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let (a, b) = (lo.log10().floor(), hi.log10().ceil());
    // A hair beyond each end, so that rounding keeps both end decades' ticks inside.
    (10f64.powf(a) * 0.999, 10f64.powf(if b > a { b } else { a + 1.0 }) * 1.001)
}

/// The x axis's range for numeric `xs` (finite): a degenerate one (no points, or all
/// at one x) is widened, since plotters looks for tick marks in an empty range forever.
fn x_range(xs: &[f64], log: bool) -> (f64, f64) {
    let lo = xs.iter().copied().filter(|x| !log || *x > 0.0).fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().filter(|x| !log || *x > 0.0).fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return if log { (0.1, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        return decades(lo / 2.0, hi * 2.0);
    }
    let pad = if hi - lo > lo.abs().max(1.0) * 1e-6 { 0.0 } else { lo.abs().max(1.0) * 0.1 };
    (lo - pad, hi + pad)
}

/// Renders `chart` to an SVG document.
pub fn render(chart: &Chart) -> DrawResult<String> {
    match chart.kind {
        ChartKind::Bars => categories(chart, true),
        ChartKind::Dots => categories(chart, false),
        ChartKind::Lines | ChartKind::Percentiles => lines(chart),
    }
}

/// Horizontal bars (`bars`) or dots with error bars over categories.
fn categories(chart: &Chart, bars: bool) -> DrawResult<String> {
    let cats = &chart.x.categories;
    let n = cats.len().max(1);
    let k = chart.series.len().max(1);
    let band = (14 * k as u32 + 12).max(30);
    let label_w = cats.iter().map(|c| text_width(c, 13)).max().unwrap_or(40).clamp(40, 260) + 16;
    let lw = legend_width(&chart.series);
    let height = 90 + n as u32 * band + 50;
    let log = chart.y.scale == Scale::Log && !bars;
    let (lo, hi) = value_range(&chart.series, log, bars);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (plot, side) = root.split_horizontally(WIDTH - lw);
        let cat_keys: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
        let y_fmt = |v: &f64| {
            let i = n as i64 - 1 - v.floor() as i64;
            usize::try_from(i).ok().and_then(|i| cats.get(i)).cloned().unwrap_or_default()
        };
        let x_fmt = |v: &f64| format::with_unit(&chart.y.unit, *v);
        let y_range = Keyed { range: 0f64..n as f64, keys: cat_keys };
        let mut builder = ChartBuilder::on(&plot);
        builder.caption(&chart.title, (FONT, 18)).margin(12).x_label_area_size(48).y_label_area_size(label_w);
        macro_rules! draw {
            ($x:expr) => {{
                let mut c = builder.build_cartesian_2d($x, y_range.clone()).map_err(err)?;
                c.configure_mesh()
                    .disable_y_mesh()
                    .x_labels(8)
                    .x_label_formatter(&x_fmt)
                    .y_label_formatter(&y_fmt)
                    .x_desc(axis_desc(&chart.y))
                    .label_style((FONT, 13))
                    .axis_desc_style((FONT, 13))
                    .draw()
                    .map_err(err)?;
                let h = 0.8 / k as f64;
                for (si, s) in chart.series.iter().enumerate() {
                    let col = color(si);
                    for p in &s.points {
                        if !p.y.is_finite() || (log && p.y <= 0.0) {
                            continue;
                        }
                        let row = n as f64 - 1.0 - p.x;
                        let y = row + 0.5 + 0.4 - h * (si as f64 + 0.5);
                        if bars {
                            c.draw_series(std::iter::once(Rectangle::new(
                                [(lo, y - h * 0.42), (p.y, y + h * 0.42)],
                                col.filled(),
                            )))
                            .map_err(err)?;
                        } else {
                            c.draw_series(std::iter::once(Circle::new((p.y, y), 5, col.filled()))).map_err(err)?;
                        }
                        if let (Some(l), Some(u)) = (p.low, p.high)
                            && l.is_finite()
                            && u.is_finite()
                            && (!log || l > 0.0)
                            && u > l
                        {
                            c.draw_series(std::iter::once(ErrorBar::new_horizontal(
                                y,
                                l,
                                p.y,
                                u,
                                BLACK.stroke_width(1),
                                8,
                            )))
                            .map_err(err)?;
                        }
                    }
                }
            }};
        }
        if log {
            draw!((lo..hi).log_scale());
        } else {
            draw!(lo..hi);
        }
        legend(&side, &chart.series, false)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn axis_desc(a: &netlane_report::Axis) -> String {
    let unit = match &a.unit {
        Unit::Seconds | Unit::BytesPerSecond | Unit::Category | Unit::Nines | Unit::Percent | Unit::Ratio => "",
        Unit::Count(u) => u.as_str(),
    };
    let scale = if a.scale == Scale::Log { " (log scale)" } else { "" };
    if unit.is_empty() || a.label.contains(unit) {
        format!("{}{scale}", a.label)
    } else {
        format!("{} ({unit}){scale}", a.label)
    }
}

/// The mesh, and each series as a line with markers and error bars, on a built chart.
fn draw_lines<X, Y, DB>(
    c: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    chart: &Chart,
    x_fmt: &dyn Fn(&f64) -> String,
    y_fmt: &dyn Fn(&f64) -> String,
    x_labels: usize,
) -> DrawResult<()>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    DB: DrawingBackend,
{
    c.configure_mesh()
        .x_labels(x_labels)
        .y_labels(8)
        .x_label_formatter(x_fmt)
        .y_label_formatter(y_fmt)
        .x_desc(axis_desc(&chart.x))
        .y_desc(axis_desc(&chart.y))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(err)?;
    let y_log = chart.y.scale == Scale::Log;
    let xs = chart_xs(&chart.series);
    for (si, s) in chart.series.iter().enumerate() {
        let col = color(si);
        let pts: Vec<(f64, f64)> =
            s.points.iter().filter(|p| p.y.is_finite() && (!y_log || p.y > 0.0)).map(|p| (p.x, p.y)).collect();
        // A line only between neighbouring x values the chart has: where this series was
        // not measured (or measured nothing), it breaks.
        for run in runs(&pts, &xs) {
            c.draw_series(LineSeries::new(run.to_vec(), col.stroke_width(2))).map_err(err)?;
        }
        c.draw_series(pts.iter().map(|p| Circle::new(*p, 4, col.filled()))).map_err(err)?;
        for p in &s.points {
            if let (Some(l), Some(u)) = (p.low, p.high)
                && l.is_finite()
                && u.is_finite()
                && (!y_log || l > 0.0)
                && u > l
            {
                c.draw_series(std::iter::once(ErrorBar::new_vertical(p.x, l, p.y, u, col.stroke_width(1), 8)))
                    .map_err(err)?;
            }
        }
    }
    Ok(())
}

/// Lines with markers and vertical error bars; percentile plots too.
fn lines(chart: &Chart) -> DrawResult<String> {
    let lw = legend_width(&chart.series);
    let height = 440;
    let percentiles = chart.kind == ChartKind::Percentiles;
    let cats = &chart.x.categories;
    let xs: Vec<f64> =
        chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).filter(|v| v.is_finite()).collect();
    let (x_lo, x_hi) = if !cats.is_empty() {
        (-0.3, cats.len() as f64 - 0.7)
    } else if percentiles {
        let hi = xs.iter().copied().fold(format::nines_x(99.0), f64::max);
        (format::nines_x(50.0) - 0.15, hi + 0.25)
    } else {
        x_range(&xs, chart.x.scale == Scale::Log)
    };
    let y_log = chart.y.scale == Scale::Log;
    let (y_lo, y_hi) = value_range(&chart.series, y_log, false);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (plot, side) = root.split_horizontally(WIDTH - lw);
        let x_fmt = |v: &f64| {
            if !cats.is_empty() {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    cats.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            } else {
                format::with_unit(&chart.x.unit, *v)
            }
        };
        let y_fmt = |v: &f64| format::with_unit(&chart.y.unit, *v);
        let mut builder = ChartBuilder::on(&plot);
        builder.caption(&chart.title, (FONT, 18)).margin(12).x_label_area_size(48).y_label_area_size(80);
        let x_labels = if cats.is_empty() { 10 } else { cats.len() };
        if percentiles {
            let keys: Vec<f64> = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999]
                .iter()
                .map(|p| format::nines_x(*p))
                .filter(|x| *x <= x_hi)
                .collect();
            let x = Keyed { range: x_lo..x_hi, keys };
            if y_log {
                let mut c = builder.build_cartesian_2d(x, (y_lo..y_hi).log_scale()).map_err(err)?;
                draw_lines(&mut c, chart, &x_fmt, &y_fmt, 10)?;
            } else {
                let mut c = builder.build_cartesian_2d(x, y_lo..y_hi).map_err(err)?;
                draw_lines(&mut c, chart, &x_fmt, &y_fmt, 10)?;
            }
        } else {
            match (chart.x.scale == Scale::Log && cats.is_empty(), y_log) {
                (true, true) => {
                    let mut c =
                        builder.build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale()).map_err(err)?;
                    draw_lines(&mut c, chart, &x_fmt, &y_fmt, x_labels)?;
                }
                (true, false) => {
                    let mut c = builder.build_cartesian_2d((x_lo..x_hi).log_scale(), y_lo..y_hi).map_err(err)?;
                    draw_lines(&mut c, chart, &x_fmt, &y_fmt, x_labels)?;
                }
                (false, true) => {
                    let mut c = builder.build_cartesian_2d(x_lo..x_hi, (y_lo..y_hi).log_scale()).map_err(err)?;
                    draw_lines(&mut c, chart, &x_fmt, &y_fmt, x_labels)?;
                }
                (false, false) => {
                    let mut c = builder.build_cartesian_2d(x_lo..x_hi, y_lo..y_hi).map_err(err)?;
                    draw_lines(&mut c, chart, &x_fmt, &y_fmt, x_labels)?;
                }
            }
        }
        legend(&side, &chart.series, true)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlane_report::{Axis, Point};

    fn pt(x: f64, y: f64) -> Point {
        Point { x, y, low: Some(y * 0.9), high: Some(y * 1.1) }
    }

    /// Charts with nothing to draw (every run invalid) or one x value still render; an
    /// empty x range once made plotters look for tick marks forever.
    #[test]
    fn degenerate_line_charts_render() {
        for points in [vec![], vec![pt(2000.0, 3e-4)], vec![pt(1e12, 3e-4), pt(1e12, 4e-4)]] {
            for (xs, ys) in [(Scale::Linear, Scale::Log), (Scale::Log, Scale::Linear), (Scale::Linear, Scale::Linear)] {
                let c = Chart {
                    name: "p999".into(),
                    title: "p99.9 by rate".into(),
                    kind: ChartKind::Lines,
                    x: Axis::numeric("rate", Unit::Count("requests/s".into()), xs),
                    y: Axis::numeric("p99.9", Unit::Seconds, ys),
                    series: vec![Series { name: "netlane".into(), points: points.clone() }],
                };
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || tx.send(render(&c).map(|s| s.len()).map_err(|e| e.to_string())));
                let drawn = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the chart rendered in time");
                assert!(drawn.unwrap() > 100, "{points:?} {xs:?} {ys:?}");
            }
        }
        assert_eq!(x_range(&[], false), (0.0, 1.0));
        assert_eq!(x_range(&[5.0, 5.0], false), (4.5, 5.5));
        assert_eq!(x_range(&[1.0, 3.0], false), (1.0, 3.0));
    }

    #[test]
    fn category_bars_have_names_legend_and_error_bars() {
        let c = Chart {
            name: "tp".into(),
            title: "Throughput".into(),
            kind: ChartKind::Bars,
            x: Axis::categories("mode", vec!["udp".into(), "gso-gro".into()]),
            y: Axis::numeric("receiver", Unit::BytesPerSecond, Scale::Linear),
            series: vec![Series { name: "receiver".into(), points: vec![pt(0.0, 3e8), pt(1.0, 5.9e9)] }],
        };
        let svg = render(&c).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("gso-gro") && svg.contains("receiver"), "{svg}");
        assert!(svg.contains("GB/s"), "human tick labels");
        assert!(svg.matches("<rect").count() >= 3, "bars and a legend swatch");
    }

    #[test]
    fn percentile_plots_use_a_nines_axis() {
        let c = Chart {
            name: "lat".into(),
            title: "Latency".into(),
            kind: ChartKind::Percentiles,
            x: Axis::numeric("percentile", Unit::Nines, Scale::Linear),
            y: Axis::numeric("latency", Unit::Seconds, Scale::Log),
            series: vec![Series {
                name: "direct send".into(),
                points: [(50.0, 30e-6), (99.0, 80e-6), (99.99, 900e-6)]
                    .iter()
                    .map(|(p, v)| Point { x: format::nines_x(*p), y: *v, low: None, high: None })
                    .collect(),
            }],
        };
        let svg = render(&c).unwrap();
        assert!(svg.contains("99.99%") && svg.contains("99%") && svg.contains("µs"), "{svg}");
    }

    /// Up to sixteen series, no colour twice; a series' line breaks where it was not
    /// measured.
    #[test]
    fn colours_do_not_repeat_and_lines_break_at_unmeasured_points() {
        for i in 0..PALETTE.len() {
            for j in i + 1..PALETTE.len() {
                assert_ne!(color(i), color(j), "{i} and {j}");
            }
        }
        let xs = [1.0, 100.0, 10_000.0, 1e6];
        let pts = [(1.0, 2.0), (10_000.0, 3.0), (1e6, 4.0)];
        let r = runs(&pts, &xs);
        assert_eq!(r, vec![&pts[..1], &pts[1..]], "no line from 1 to 10,000 across 100");
        assert_eq!(runs(&[], &xs).len(), 0);
        let series: Vec<Series> = (0..15)
            .map(|i| Series { name: format!("s{i}"), points: vec![pt(1.0, 1.0 + i as f64), pt(2.0, 2.0 + i as f64)] })
            .collect();
        let c = Chart {
            name: "many".into(),
            title: "Fifteen series".into(),
            kind: ChartKind::Lines,
            x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Linear),
            y: Axis::numeric("Mpps", Unit::Count("Mpps".into()), Scale::Linear),
            series,
        };
        let svg = render(&c).unwrap();
        let strokes: std::collections::HashSet<&str> =
            svg.split("stroke=\"").skip(1).filter_map(|r| r.split('"').next()).filter(|c| *c != "none").collect();
        assert!(strokes.len() >= 15, "{strokes:?}");
    }

    /// A log axis whose values span less than a decade still has labelled ticks.
    #[test]
    fn a_log_axis_within_one_decade_is_labelled() {
        let near = |(a, b): (f64, f64), (x, y): (f64, f64)| (a / x - 1.0).abs() < 0.01 && (b / y - 1.0).abs() < 0.01;
        assert!(near(decades(125.0, 800.0), (100.0, 1000.0)));
        assert!(near(decades(100.0, 100.0), (100.0, 1000.0)));
        assert!(near(decades(0.3, 40.0), (0.1, 100.0)));
        let c = Chart {
            name: "p99".into(),
            title: "p99 by rate".into(),
            kind: ChartKind::Lines,
            x: Axis::numeric("rate", Unit::Count("requests/s".into()), Scale::Linear),
            y: Axis::numeric("p99", Unit::Seconds, Scale::Log),
            series: vec![Series { name: "netlane".into(), points: vec![pt(1e4, 2e-4), pt(2e4, 5e-4)] }],
        };
        let svg = render(&c).unwrap();
        assert!(svg.contains("100 µs") && svg.contains("1 ms"), "decade labels: {svg}");
    }

    #[test]
    fn log_x_lines() {
        let c = Chart {
            name: "pps".into(),
            title: "Mpps per core".into(),
            kind: ChartKind::Lines,
            x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Log),
            y: Axis::numeric("Mpps per core", Unit::Count("Mpps".into()), Scale::Linear),
            series: vec![Series { name: "untagged".into(), points: vec![pt(1.0, 3.2), pt(1e4, 2.0), pt(1e6, 1.3)] }],
        };
        let svg = render(&c).unwrap();
        assert!(svg.contains("1M") && svg.contains("untagged"), "{svg}");
    }
}
