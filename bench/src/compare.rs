//! `--compare baseline.jsonl candidate.jsonl [--threshold 0.9]`: busbw ratio (candidate /
//! baseline) per op, placement and size; a ratio below the threshold is flagged.

use crate::record::Record;
use std::collections::BTreeMap;
use std::fmt::Write;

/// (op, placement, size): rank counts may differ between the files (shown in the table).
type Key = (String, String, u64);

/// The backend a file is about: the most frequent one other than the references (openmpi,
/// memcpy), or the most frequent one at all.
fn primary(recs: &[Record]) -> Option<String> {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for r in recs {
        *n.entry(r.backend.as_str()).or_default() += 1;
    }
    let pick = |skip: bool| {
        n.iter().filter(|(b, _)| !skip || !matches!(**b, "openmpi" | "memcpy")).max_by_key(|(_, c)| **c).map(|(b, _)| b.to_string())
    };
    pick(true).or_else(|| pick(false))
}

fn index(recs: &[Record]) -> BTreeMap<Key, &Record> {
    let p = primary(recs);
    recs.iter().filter(|r| Some(&r.backend) == p.as_ref()).map(|r| ((r.op.clone(), r.placement.clone(), r.size), r)).collect()
}

/// The table, and how many rows are below the threshold.
pub fn compare(base: &[Record], cand: &[Record], threshold: f64) -> (String, usize) {
    let (a, b) = (index(base), index(cand));
    let mut s = String::new();
    let (pa, pb) = (primary(base).unwrap_or_default(), primary(cand).unwrap_or_default());
    let _ = writeln!(s, "# busbw ratio {pb} (candidate) / {pa} (baseline); flagged below {threshold}");
    let _ = writeln!(
        s,
        "# {:>14} {:>12} {:>5} {:>12} {:>10} {:>10} {:>7}  flag",
        "op", "placement", "ranks", "size(B)", "base GB/s", "cand GB/s", "ratio"
    );
    let mut flagged = 0;
    let mut missing = 0;
    for (k, ra) in &a {
        let Some(rb) = b.get(k) else {
            missing += 1;
            continue;
        };
        let ratio = if ra.busbw > 0.0 { rb.busbw / ra.busbw } else { f64::NAN };
        let bad = ratio < threshold;
        flagged += usize::from(bad);
        let _ = writeln!(
            s,
            "  {:>14} {:>12} {:>5} {:>12} {:>10.3} {:>10.3} {:>7.3}  {}",
            k.0,
            k.1,
            if ra.ranks == rb.ranks { ra.ranks.to_string() } else { format!("{}/{}", ra.ranks, rb.ranks) },
            k.2,
            ra.busbw,
            rb.busbw,
            ratio,
            if bad { "REGRESSION" } else { "" }
        );
    }
    let _ = writeln!(
        s,
        "# {flagged} of {} rows below {threshold}{}",
        a.len() - missing,
        if missing > 0 { format!("; {missing} baseline rows have no candidate row") } else { String::new() }
    );
    (s, flagged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample;

    #[test]
    fn compare_flags_rows_below_the_threshold() {
        let base = vec![
            sample("shm", "all_reduce", 1024, 1.0),
            sample("shm", "all_reduce", 2048, 2.0),
            sample("openmpi", "all_reduce", 1024, 9.0),
        ];
        let cand = vec![sample("shm", "all_reduce", 1024, 0.5), sample("shm", "all_reduce", 2048, 2.2)];
        let (table, flagged) = compare(&base, &cand, 0.9);
        assert_eq!(flagged, 1, "{table}");
        let lines: Vec<&str> = table.lines().collect();
        let row1024 = lines.iter().find(|l| l.contains(" 1024 ")).unwrap();
        assert!(row1024.contains("0.500") && row1024.contains("REGRESSION"), "{row1024}");
        let row2048 = lines.iter().find(|l| l.contains(" 2048 ")).unwrap();
        assert!(row2048.contains("1.100") && !row2048.contains("REGRESSION"), "{row2048}");
        assert!(table.contains("1 of 2 rows below 0.9"), "{table}");
        assert!(table.contains("shm (candidate) / shm (baseline)"), "the openmpi reference rows are not compared: {table}");
    }
}
