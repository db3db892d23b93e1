//! The PNG plot of one (collective, mode): bus bandwidth and latency against size, one line
//! per backend. Drawn by plotters into an RGB buffer with an embedded font (DejaVu Sans,
//! `assets/`), so no system font is needed, and encoded with the `png` crate.

use std::sync::Once;

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::backend::BackendKind;
use crate::run::Row;
use crate::spec::format_size;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// One backend's line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Which backend.
    pub backend: BackendKind,
    /// (bytes, busbw GB/s, time µs) per measured size.
    pub points: Vec<(usize, f64, f64)>,
}

/// The series of one block of rows (measured cells only).
pub fn series_of(rows: &[&Row], backends: &[BackendKind]) -> Vec<Series> {
    backends
        .iter()
        .map(|&backend| Series {
            backend,
            points: rows
                .iter()
                .filter_map(|r| {
                    let c = r.cell(backend)?;
                    Some((r.bytes, c.busbw_gbps?, c.time_us?))
                })
                .collect(),
        })
        .collect()
}

fn color(b: BackendKind) -> RGBColor {
    match b {
        BackendKind::Purlin => RGBColor(214, 39, 40),
        BackendKind::Nccl => RGBColor(31, 119, 180),
        BackendKind::NcclSymm => RGBColor(44, 160, 44),
    }
}

fn register() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut ok = true;
    ONCE.call_once(|| ok = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(anyhow!("the embedded font could not be loaded")) }
}

/// Renders the two panels (busbw, latency) as a PNG of `w`×`h` pixels.
pub fn render_png(title: &str, series: &[Series], w: u32, h: u32) -> Result<Vec<u8>> {
    register()?;
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw(&mut rgb, title, series, w, h).map_err(|e| anyhow!("plot: {e}"))?;
    let mut png_bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png_bytes, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        // The crate's default (fast deflate, Sub filter) wrote ~880 KB per plot; these are
        // flat-coloured line drawings, which deflate ~14× smaller with adaptive filtering.
        enc.set_compression(png::Compression::Best);
        enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
        let mut writer = enc.write_header().context("png header")?;
        writer.write_image_data(&rgb).context("png data")?;
    }
    Ok(png_bytes)
}

fn draw(rgb: &mut [u8], title: &str, series: &[Series], w: u32, h: u32) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(rgb, (w, h)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FAMILY, 22))?;
    let panels = root.split_evenly((1, 2));
    let all: Vec<&(usize, f64, f64)> = series.iter().flat_map(|s| &s.points).collect();
    let (xmin, xmax) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0 as f64), b.max(p.0 as f64)));
    let (xmin, xmax) = if xmin > xmax { (8.0, 1024.0) } else { (xmin.max(1.0), xmax.max(xmin * 2.0)) };
    let bw_max = all.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1.0) * 1.1;
    let (tmin, tmax) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.2), b.max(p.2)));
    let (tmin, tmax) = if tmin > tmax { (1.0, 10.0) } else { (tmin.max(1e-3) / 1.5, tmax.max(tmin * 2.0) * 1.5) };
    let xfmt = |x: &f64| format_size(x.round() as usize);

    for (i, panel) in panels.iter().enumerate() {
        let busbw = i == 0;
        let mut chart = ChartBuilder::on(panel);
        chart.margin(12).x_label_area_size(48).y_label_area_size(70).caption(
            if busbw { "bus bandwidth (GB/s, higher is better)" } else { "time per call (us, lower is better)" },
            (FAMILY, 18),
        );
        macro_rules! lines {
            ($chart:expr, $y:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc("size (bytes)")
                    .x_label_formatter(&xfmt)
                    .x_labels(16)
                    .label_style((FAMILY, 13))
                    .axis_desc_style((FAMILY, 15))
                    .light_line_style(RGBColor(235, 235, 235))
                    .draw()?;
                for s in series.iter().filter(|s| !s.points.is_empty()) {
                    let c = color(s.backend);
                    let pts: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0 as f64, $y(p))).collect();
                    chart
                        .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                        .label(s.backend.name())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
                    chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))?;
                }
                chart
                    .configure_series_labels()
                    .position(if busbw { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::UpperLeft })
                    .label_font((FAMILY, 15))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()?;
            }};
        }
        if busbw {
            let c = chart.build_cartesian_2d((xmin..xmax).log_scale().base(4.0), 0.0..bw_max)?;
            lines!(c, |p: &(usize, f64, f64)| p.1);
        } else if tmax / tmin >= 30.0 {
            let c = chart.build_cartesian_2d((xmin..xmax).log_scale().base(4.0), (tmin..tmax).log_scale())?;
            lines!(c, |p: &(usize, f64, f64)| p.2);
        } else {
            // Less than a decade and a half: a log axis would show one label at most.
            let c = chart.build_cartesian_2d((xmin..xmax).log_scale().base(4.0), 0.0..tmax / 1.5 * 1.1)?;
            lines!(c, |p: &(usize, f64, f64)| p.2);
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders synthetic data (no GPU needed) and checks the PNG decodes to the right size,
    /// with each backend's colour present. Set PURLIN_BENCH_PLOT_DIR to keep the file.
    #[test]
    fn renders_a_png_from_synthetic_data() {
        let mut series = Vec::new();
        for (b, lat, bw) in
            [(BackendKind::Nccl, 18.0, 330.0), (BackendKind::NcclSymm, 9.0, 300.0), (BackendKind::Purlin, 5.0, 360.0)]
        {
            let points = (3..=30)
                .map(|k| {
                    let bytes = 1usize << k;
                    let t = lat + bytes as f64 / (bw * 1e3);
                    (bytes, bytes as f64 / t / 1e3, t)
                })
                .collect();
            series.push(Series { backend: b, points });
        }
        let png_bytes = render_png("all-reduce f32 sum eager, world 2 (synthetic)", &series, 1400, 560).unwrap();
        if let Ok(dir) = std::env::var("PURLIN_BENCH_PLOT_DIR") {
            std::fs::write(std::path::Path::new(&dir).join("synthetic.png"), &png_bytes).unwrap();
        }
        let decoder = png::Decoder::new(std::io::Cursor::new(&png_bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (1400, 560));
        let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks_exact(3).collect();
        for b in BackendKind::ALL {
            let RGBColor(r, g, bl) = color(b);
            assert!(pixels.iter().filter(|p| **p == [r, g, bl]).count() > 100, "{b}'s line is missing");
        }
        // Text was drawn: dark pixels beyond the axes' lines.
        assert!(pixels.iter().filter(|p| p[0] < 60 && p[1] < 60 && p[2] < 60).count() > 2000);
    }
}
