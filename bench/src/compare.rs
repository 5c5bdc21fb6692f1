//! `--compare baseline.jsonl candidate.jsonl [--threshold 0.9]`: busbw ratio (candidate /
//! baseline) per op, placement and size; a ratio below the threshold is flagged.

use crate::record::Record;
use std::collections::BTreeMap;
use std::fmt::Write;

/// (op, placement, dtype, redop, size, ranks): a row is compared only with the same op at the
/// same size in the same dtype and reduce op; a float sum is never set against a half max.
type Key = (String, String, String, String, u64, usize);

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

fn key(r: &Record) -> Key {
    (r.op.clone(), r.placement.clone(), r.dtype.clone(), r.redop.clone(), r.size, r.ranks)
}

fn index(recs: &[Record]) -> BTreeMap<Key, &Record> {
    let p = primary(recs);
    recs.iter().filter(|r| Some(&r.backend) == p.as_ref()).map(|r| (key(r), r)).collect()
}

/// What a file's rows are: `float sum at 2 ranks`, for the message when nothing matches.
fn what(rows: &BTreeMap<Key, &Record>) -> String {
    let kinds: std::collections::BTreeSet<String> = rows.keys().map(|k| format!("{} {} at {} ranks", k.2, k.3, k.5)).collect();
    if kinds.is_empty() {
        "no rows".into()
    } else {
        kinds.into_iter().collect::<Vec<_>>().join(", ")
    }
}

/// The table, and how many rows are below the threshold; an error when no row of the baseline
/// has a candidate row to compare with (different ops, sizes, dtype or reduce op): a
/// comparison of nothing must not pass as "0 rows below".
///
/// Rows match on op, placement, dtype, reduce op, size and rank count; when each file holds a
/// single rank count, rows of different rank counts are matched too (shown `2/4`).
pub fn compare(base: &[Record], cand: &[Record], threshold: f64) -> Result<(String, usize), String> {
    let (a, b) = (index(base), index(cand));
    let ranks = |m: &BTreeMap<Key, &Record>| m.keys().map(|k| k.5).collect::<std::collections::BTreeSet<usize>>();
    let (ra_set, rb_set) = (ranks(&a), ranks(&b));
    let across = ra_set.len() == 1 && rb_set.len() == 1 && ra_set != rb_set;
    let other = rb_set.iter().next().copied().unwrap_or(0);
    let mut s = String::new();
    let (pa, pb) = (primary(base).unwrap_or_default(), primary(cand).unwrap_or_default());
    let _ = writeln!(s, "# busbw ratio {pb} (candidate) / {pa} (baseline); flagged below {threshold}");
    let _ = writeln!(
        s,
        "# {:>14} {:>12} {:>8} {:>6} {:>5} {:>12} {:>10} {:>10} {:>7}  flag",
        "op", "placement", "type", "redop", "ranks", "size(B)", "base GB/s", "cand GB/s", "ratio"
    );
    let mut flagged = 0;
    let mut missing = 0;
    for (k, ra) in &a {
        let found = b.get(k).or_else(|| {
            let mut k2 = k.clone();
            k2.5 = other;
            across.then(|| b.get(&k2)).flatten()
        });
        let Some(rb) = found else {
            missing += 1;
            continue;
        };
        let ratio = if ra.busbw > 0.0 { rb.busbw / ra.busbw } else { f64::NAN };
        let bad = ratio < threshold;
        flagged += usize::from(bad);
        let _ = writeln!(
            s,
            "  {:>14} {:>12} {:>8} {:>6} {:>5} {:>12} {:>10.3} {:>10.3} {:>7.3}  {}",
            k.0,
            k.1,
            k.2,
            k.3,
            if ra.ranks == rb.ranks { ra.ranks.to_string() } else { format!("{}/{}", ra.ranks, rb.ranks) },
            k.4,
            ra.busbw,
            rb.busbw,
            ratio,
            if bad { "REGRESSION" } else { "" }
        );
    }
    if a.len() == missing {
        return Err(format!(
            "nothing to compare: no row of the baseline ({}) has a row of the candidate ({}) with the same op, placement, \
             dtype, reduce op, size and rank count",
            what(&a),
            what(&b)
        ));
    }
    let _ = writeln!(
        s,
        "# {flagged} of {} rows below {threshold}{}",
        a.len() - missing,
        if missing > 0 { format!("; {missing} baseline rows have no candidate row") } else { String::new() }
    );
    Ok((s, flagged))
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
        let (table, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 1, "{table}");
        let lines: Vec<&str> = table.lines().collect();
        let row1024 = lines.iter().find(|l| l.contains(" 1024 ")).unwrap();
        assert!(row1024.contains("0.500") && row1024.contains("REGRESSION"), "{row1024}");
        let row2048 = lines.iter().find(|l| l.contains(" 2048 ")).unwrap();
        assert!(row2048.contains("1.100") && !row2048.contains("REGRESSION"), "{row2048}");
        assert!(table.contains("1 of 2 rows below 0.9"), "{table}");
        assert!(table.contains("shm (candidate) / shm (baseline)"), "the openmpi reference rows are not compared: {table}");
    }

    #[test]
    fn compare_matches_dtype_redop_and_ranks() {
        let with = |r: Record, dtype: &str, redop: &str, ranks: usize| Record { dtype: dtype.into(), redop: redop.into(), ranks, ..r };
        // A float sum at 2 ranks against a half max at 4 ranks: nothing to compare, an error
        // (it was a "REGRESSION" table, exit 1, comparing unlike rows).
        let base = vec![sample("shm", "all_reduce", 4096, 1.0)];
        let cand = vec![with(sample("shm", "all_reduce", 4096, 0.1), "half", "max", 4)];
        let e = compare(&base, &cand, 0.9).unwrap_err();
        assert!(e.contains("nothing to compare") && e.contains("float sum at 2 ranks") && e.contains("half max at 4 ranks"), "{e}");
        // The same dtype and reduce op at another rank count (one count per file): compared.
        let cand = vec![with(sample("shm", "all_reduce", 4096, 0.5), "float", "sum", 4)];
        let (t, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 1, "{t}");
        assert!(t.contains(" 2/4 "), "{t}");
        // Files with rows at 2 and 4 ranks each: every row meets its own rank count.
        let base = vec![sample("shm", "all_reduce", 4096, 1.0), with(sample("shm", "all_reduce", 4096, 3.0), "float", "sum", 4)];
        let cand = vec![sample("shm", "all_reduce", 4096, 1.0), with(sample("shm", "all_reduce", 4096, 3.0), "float", "sum", 4)];
        let (t, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 0, "{t}");
        assert!(t.contains("0 of 2 rows below"), "{t}");
    }
}
