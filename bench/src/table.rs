//! nccl-tests' table, column for column, plus a peer's columns when one ran alongside (OpenMPI,
//! or the backend's reference such as the raw NCCL loop).

/// One placement's cells: time (us), algbw, busbw (GB/s), #wrong.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cells {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: u64,
}

/// nccl-tests' time format: 2 decimals below 100 us, 1 below 10 ms, none above.
pub fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// Side-by-side columns of a peer measured in the same run (OpenMPI, or a backend's reference
/// such as the raw NCCL loop): its label, and whether it has in-place columns too.
#[derive(Clone, Copy, Debug)]
pub struct PeerCols<'a> {
    pub label: &'a str,
    pub in_place: bool,
}

/// The three header lines (with a peer's columns when given).
pub fn header(peer: Option<PeerCols<'_>>) -> String {
    let (mut m0, mut m1, mut m2) = (String::new(), String::new(), String::new());
    if let Some(p) = peer {
        m0 = format!("  {:<22}", format!("{} out-of-place", p.label));
        m1 = "     time   busbw  ratio".into();
        m2 = "     (us)  (GB/s)    (x)".into();
        if p.in_place {
            m0.push_str(&format!("  {:<14}", "in-place"));
            m1.push_str("     time  ratio");
            m2.push_str("     (us)    (x)");
        }
    }
    format!(
        "#                                                              out-of-place                       in-place          {m0}\n\
         #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong{m1}\n\
         #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       {m2}"
    )
}

fn cells(c: Option<Cells>) -> String {
    match c {
        Some(c) => format!("  {}  {:6.2}  {:6.2}  {:5}", time_str(c.time_us), c.algbw, c.busbw, c.wrong),
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// A peer's cells in one row: out-of-place (time us, busbw), and with in-place columns
/// `Some(in-place time)`. `None` values print `-`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerRow {
    pub out: Option<(f64, f64)>,
    pub inp: Option<Option<f64>>,
}

/// `peer time / backend time` (= the busbw ratio; above 1: the backend is faster).
pub fn ratio(backend_us: f64, peer_us: f64) -> Option<f64> {
    (backend_us > 0.0 && peer_us > 0.0).then(|| peer_us / backend_us)
}

fn ratio_str(r: Option<f64>) -> String {
    r.map_or_else(|| format!("{:>5}", "-"), |r| format!("{r:5.2}"))
}

/// One row, with the peer's cells when its columns are shown; the ratio is the peer's time
/// over the backend's ([`ratio`]).
#[allow(clippy::too_many_arguments)]
pub fn row(
    size: usize,
    count: usize,
    dtype: &str,
    redop: &str,
    root: i64,
    out: Option<Cells>,
    inp: Option<Cells>,
    peer: Option<PeerRow>,
) -> String {
    let mut s = format!("{size:12}  {count:12}  {dtype:>8}  {redop:>6}  {root:6}{}{}", cells(out), cells(inp));
    let Some(p) = peer else { return s };
    match p.out {
        None => s.push_str(&format!("  {:>7}  {:>6}  {:>5}", "-", "-", "-")),
        Some((t, bw)) => s.push_str(&format!("  {}  {bw:6.2}  {}", time_str(t), ratio_str(out.and_then(|o| ratio(o.time_us, t))))),
    }
    match p.inp {
        None => {}
        Some(None) => s.push_str(&format!("  {:>7}  {:>5}", "-", "-")),
        Some(Some(t)) => s.push_str(&format!("  {}  {}", time_str(t), ratio_str(inp.and_then(|i| ratio(i.time_us, t))))),
    }
    s
}

/// `# Avg bus bandwidth    : 1.234` over every busbw printed (both placements), as nccl-tests.
pub fn avg_line(busbws: &[f64]) -> String {
    let avg = if busbws.is_empty() { 0.0 } else { busbws.iter().sum::<f64>() / busbws.len() as f64 };
    format!("# Avg bus bandwidth    : {avg:.4} ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_line_up_with_the_header() {
        let c = Some(Cells { time_us: 12.5, algbw: 1.0, busbw: 1.5, wrong: 0 });
        let r = row(1048576, 262144, "float", "sum", -1, c, None, None);
        let h = header(None);
        let cols = h.lines().nth(1).unwrap();
        assert_eq!(r.len(), cols.len(), "\n{cols}\n{r}");
        assert!(r.contains("N/A"));
        let mpi = Some(PeerCols { label: "openmpi", in_place: false });
        let r = row(1048576, 262144, "float", "sum", -1, c, c, Some(PeerRow { out: Some((25.0, 0.75)), inp: None }));
        assert_eq!(r.len(), header(mpi).lines().nth(1).unwrap().len());
        assert!(r.ends_with(" 2.00"), "{r}");
        // A reference with in-place columns: ratio = its time / the backend's.
        let raw = Some(PeerCols { label: "nccl-raw", in_place: true });
        let r = row(1048576, 262144, "float", "sum", -1, c, c, Some(PeerRow { out: Some((10.0, 0.75)), inp: Some(Some(12.5)) }));
        assert_eq!(r.len(), header(raw).lines().nth(1).unwrap().len(), "\n{}\n{r}", header(raw));
        assert!(r.ends_with("   0.80    12.50   1.00"), "{r}");
        let r = row(8, 2, "float", "sum", -1, c, None, Some(PeerRow { out: None, inp: Some(None) }));
        assert_eq!(r.len(), header(raw).lines().nth(1).unwrap().len());
        assert_eq!(avg_line(&[1.0, 2.0]), "# Avg bus bandwidth    : 1.5000 ");
        assert_eq!(time_str(123456.0), " 123456");
    }
}
