//! nccl-tests' table, column for column, plus OpenMPI's columns when it ran alongside.

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

/// The three header lines (`mpi`: with OpenMPI's columns).
pub fn header(mpi: bool) -> String {
    let (m0, m1, m2) = if mpi { ("   openmpi out-of-place", "     time   busbw  ratio", "     (us)  (GB/s)       ") } else { ("", "", "") };
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

/// One row. `mpi`: OpenMPI's (time, busbw) at this size; the ratio is the out-of-place busbw
/// over OpenMPI's.
#[allow(clippy::too_many_arguments)]
pub fn row(
    size: usize,
    count: usize,
    dtype: &str,
    redop: &str,
    root: i64,
    out: Option<Cells>,
    inp: Option<Cells>,
    mpi: Option<Option<(f64, f64)>>,
) -> String {
    let mut s = format!("{size:12}  {count:12}  {dtype:>8}  {redop:>6}  {root:6}{}{}", cells(out), cells(inp));
    match mpi {
        None => {}
        Some(None) => s.push_str(&format!("  {:>7}  {:>6}  {:>5}", "-", "-", "-")),
        Some(Some((t, bw))) => {
            let ratio = match out {
                Some(o) if bw > 0.0 => format!("{:5.2}", o.busbw / bw),
                _ => format!("{:>5}", "-"),
            };
            s.push_str(&format!("  {}  {bw:6.2}  {ratio}", time_str(t)));
        }
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
        let h = header(false);
        let cols = h.lines().nth(1).unwrap();
        assert_eq!(r.len(), cols.len(), "\n{cols}\n{r}");
        assert!(r.contains("N/A"));
        let r = row(1048576, 262144, "float", "sum", -1, c, c, Some(Some((25.0, 0.75))));
        assert_eq!(r.len(), header(true).lines().nth(1).unwrap().len());
        assert!(r.ends_with(" 2.00"), "{r}");
        assert_eq!(avg_line(&[1.0, 2.0]), "# Avg bus bandwidth    : 1.5000 ");
        assert_eq!(time_str(123456.0), " 123456");
    }
}
