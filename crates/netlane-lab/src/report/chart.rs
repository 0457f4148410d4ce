//! SVG charts with plotters: grouped bars (one group per mode) and lines over an
//! ordered set of x labels (a sweep).

use plotters::prelude::*;

use super::Chart;

const WIDTH: u32 = 900;
const HEIGHT: u32 = 420;

/// Colours that stay distinguishable in print.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One named series of values, one per category (NaN: no value).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Values.
    pub values: Vec<f64>,
}

impl Series {
    /// A series.
    pub fn new(name: impl Into<String>, values: Vec<f64>) -> Self {
        Self { name: name.into(), values }
    }
}

/// The label of category `x` on an axis whose categories sit at 0, 1, 2, ...; empty
/// between them.
fn category_label(labels: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 { labels.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
}

fn y_range(series: &[Series], log: bool) -> (f64, f64) {
    let vals = series.iter().flat_map(|s| s.values.iter().copied()).filter(|v| v.is_finite());
    let max = vals.clone().fold(0.0f64, f64::max);
    if log {
        let min = vals.filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let min = if min.is_finite() { min } else { 1e-3 };
        (min / 2.0, (max * 2.0).max(min))
    } else {
        (0.0, if max > 0.0 { max * 1.15 } else { 1.0 })
    }
}

/// Grouped bars: `categories` along x, one bar per series in each group.
pub fn bars(name: &str, title: &str, y_label: &str, categories: &[String], series: &[Series], log: bool) -> Chart {
    let mut svg = String::new();
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = categories.len().max(1);
        let (lo, hi) = y_range(series, log);
        let x_fmt = |x: &f64| category_label(categories, *x);
        let k = series.len().max(1) as f64;
        let width = 0.8 / k;
        let mut builder = ChartBuilder::on(&root);
        builder.caption(title, ("sans-serif", 20)).margin(12).x_label_area_size(60).y_label_area_size(70);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .disable_x_mesh()
                    .x_labels(n)
                    .x_label_formatter(&x_fmt)
                    .y_desc(y_label)
                    .label_style(("sans-serif", 13))
                    .draw()?;
                for (si, s) in series.iter().enumerate() {
                    let color = PALETTE[si % PALETTE.len()];
                    let offset = -0.4 + width * si as f64;
                    chart
                        .draw_series(
                            s.values.iter().enumerate().filter(|(_, v)| v.is_finite() && (!log || **v > 0.0)).map(
                                |(i, v)| {
                                    let x0 = i as f64 + offset;
                                    Rectangle::new([(x0, lo), (x0 + width * 0.95, *v)], color.filled())
                                },
                            ),
                        )?
                        .label(s.name.clone())
                        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperRight)
                    .draw()?;
            }};
        }
        if log {
            draw!(builder.build_cartesian_2d(-0.6f64..(n as f64 - 0.4), (lo..hi).log_scale())?);
        } else {
            draw!(builder.build_cartesian_2d(-0.6f64..(n as f64 - 0.4), lo..hi)?);
        }
        root.present()?;
        Ok(())
    })();
    if let Err(e) = result {
        tracing::warn!(chart = name, error = %e, "chart could not be drawn");
    }
    Chart { name: name.into(), title: title.into(), svg }
}

/// Lines with markers over ordered x labels (e.g. the quanta of a sweep).
pub fn lines(name: &str, title: &str, x_label: &str, y_label: &str, xs: &[String], series: &[Series]) -> Chart {
    let mut svg = String::new();
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let n = xs.len().max(1);
        let (lo, hi) = y_range(series, false);
        let x_fmt = |x: &f64| category_label(xs, *x);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), lo..hi)?;
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&x_fmt)
            .x_desc(x_label)
            .y_desc(y_label)
            .label_style(("sans-serif", 13))
            .draw()?;
        for (si, s) in series.iter().enumerate() {
            let color = PALETTE[si % PALETTE.len()];
            let pts: Vec<(f64, f64)> =
                s.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, v)| (i as f64, *v)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        root.present()?;
        Ok(())
    })();
    if let Err(e) = result {
        tracing::warn!(chart = name, error = %e, "chart could not be drawn");
    }
    Chart { name: name.into(), title: title.into(), svg }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_chart_is_svg_with_labels() {
        let c = bars(
            "tp",
            "Throughput",
            "MB/s",
            &["udp".into(), "gso".into()],
            &[Series::new("tx", vec![300.0, 1800.0]), Series::new("rx", vec![290.0, f64::NAN])],
            false,
        );
        assert!(c.svg.starts_with("<svg"), "{}", &c.svg[..c.svg.len().min(100)]);
        assert!(c.svg.contains("gso") && c.svg.contains("Throughput") && c.svg.contains("<rect"));
        let log = bars("l", "Log", "x", &["a".into()], &[Series::new("s", vec![0.01])], true);
        assert!(log.svg.contains("<svg"));
    }

    #[test]
    fn line_chart_is_svg() {
        let c = lines(
            "q",
            "Sweep",
            "quantum",
            "loss %",
            &["0.25ms".into(), "1ms".into()],
            &[Series::new("loss", vec![0.1, 2.0])],
        );
        assert!(c.svg.contains("<svg") && c.svg.contains("0.25ms") && c.svg.contains("<circle"));
    }
}
