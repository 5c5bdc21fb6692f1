//! SVG plots (plotters, SVG backend only, no system fonts): per op, busbw and latency against
//! size (log scales), one line per series (backend × rank count × placement, and file when
//! several files give the same series).

use crate::record::Record;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// (series label, records) pairs; a series is drawn as one line per op panel.
pub type Series = Vec<(String, Vec<Record>)>;

/// Groups the records of each file into series: `backend (N ranks) placement [file]`, the file
/// stem added only when several files are given. The memcpy reference is left out.
pub fn series_of(files: &[(String, Vec<Record>)]) -> Series {
    let mut out: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for (name, recs) in files {
        for r in recs.iter().filter(|r| r.op != "memcpy") {
            let mut label = format!("{} {}", r.label(), r.placement);
            if files.len() > 1 {
                label.push_str(&format!(" [{name}]"));
            }
            out.entry(label).or_default().push(r.clone());
        }
    }
    out.into_iter().collect()
}

/// (colour index, label, points) of one line.
type Line = (usize, String, Vec<(f64, f64)>);

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// `1k`, `10M`, `1G`: decimal, as the log axis puts its ticks at powers of ten.
fn si(x: f64) -> String {
    for (d, u) in [(1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if x >= d {
            return format!("{}{u}", (x / d * 100.0).round() / 100.0);
        }
    }
    format!("{}", x.round())
}

/// A tick value readable over many decades.
fn num(y: f64) -> String {
    if y >= 100.0 {
        format!("{y:.0}")
    } else if y >= 0.1 {
        format!("{}", (y * 100.0).round() / 100.0)
    } else {
        format!("{y:.0e}")
    }
}

/// Writes the SVG: one row per op, busbw on the left, time on the right.
pub fn write_svg(series: &Series, path: &Path) -> Result<(), String> {
    let mut ops: Vec<String> = series.iter().flat_map(|(_, rs)| rs.iter().map(|r| r.op.clone())).collect();
    ops.sort_by_key(|o| crate::spec::BenchOp::from_name(o).map(|b| b as usize).unwrap_or(99));
    ops.dedup();
    if ops.is_empty() {
        return Err("nothing to plot (no records)".into());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let height = 340 * ops.len() as u32;
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let rows = root.split_evenly((ops.len(), 2));
    for (i, op) in ops.iter().enumerate() {
        for (j, latency) in [(0, false), (1, true)] {
            let area = &rows[i * 2 + j];
            let pts: Vec<Line> = series
                .iter()
                .enumerate()
                .map(|(k, (label, rs))| {
                    let mut v: Vec<(f64, f64)> = rs
                        .iter()
                        .filter(|r| &r.op == op && r.size > 0)
                        .map(|r| (r.size as f64, if latency { r.time_us } else { r.busbw }))
                        .filter(|&(_, y)| y.is_finite() && y > 0.0)
                        .collect();
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    (k, label.clone(), v)
                })
                .filter(|(_, _, v)| !v.is_empty())
                .collect();
            let all = pts.iter().flat_map(|(_, _, v)| v.iter());
            let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
            for &(x, y) in all {
                x0 = x0.min(x);
                x1 = x1.max(x);
                y0 = y0.min(y);
                y1 = y1.max(y);
            }
            if pts.is_empty() {
                continue;
            }
            let (x1, y1) = (x1.max(x0 * 2.0), y1.max(y0 * 2.0));
            let title = format!("{op}: {}", if latency { "time (us)" } else { "busbw (GB/s)" });
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d((x0..x1).log_scale(), (y0 / 1.5..y1 * 1.5).log_scale())
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("size (bytes)")
                .x_label_formatter(&|x| si(*x))
                .y_label_formatter(&|y| num(*y))
                .draw()
                .map_err(|e| e.to_string())?;
            for (k, label, v) in pts {
                let color = COLORS[k % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(v, color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .position(if latency { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::LowerRight })
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// `--plot a.jsonl b.jsonl -o out.svg`.
pub fn plot_files(files: &[std::path::PathBuf], out: &Path) -> Result<(), String> {
    let mut loaded = Vec::new();
    for f in files {
        let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        loaded.push((stem, crate::record::read_jsonl(f)?));
    }
    write_svg(&series_of(&loaded), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample;

    #[test]
    fn plot_writes_a_valid_svg() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (i, size) in [8u64, 1024, 1 << 20].into_iter().enumerate() {
            a.push(sample("shm", "all_reduce", size, 0.5 + i as f64));
            b.push(sample("openmpi", "all_reduce", size, 0.25 + i as f64));
            a.push(sample("shm", "all_gather", size, 1.0 + i as f64));
        }
        let (fa, fb) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
        crate::record::write_jsonl(&fa, &a).unwrap();
        crate::record::write_jsonl(&fb, &b).unwrap();
        let out = dir.path().join("out.svg");
        plot_files(&[fa, fb], &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("all_reduce: busbw (GB/s)") && svg.contains("all_gather: time (us)"));
        assert!(svg.contains("shm (2 ranks) out-of-place [a]") && svg.contains("openmpi (2 ranks) out-of-place [b]"));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert!(svg.matches("<polyline").count() >= 3, "one line per series and op");
    }
}
