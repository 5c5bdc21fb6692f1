//! `--compare baseline.jsonl candidate.jsonl [--threshold 0.9]`: busbw ratio (candidate /
//! baseline) per op, placement and size. A row is flagged (and the exit status is 1) when its
//! ratio is below the threshold, when the candidate was wrong in any timed or warm-up iteration
//! (a fast wrong result is no speed-up), or when the candidate has no row for it (it stopped or
//! hung before that size). Where busbw is 0 (one rank: nccl-tests' factor is 0) the ratio is
//! algbw's, then time's; a ratio that cannot be formed is flagged, never passed as NaN.

use crate::record::Record;
use std::collections::BTreeMap;
use std::fmt::Write;

/// (op, placement, dtype, redop, root, timing, size, ranks): a row is compared only with the same
/// op at the same size in the same dtype, reduce op, root and way of timing; a float sum is never
/// set against a half max, nor device-event times against host wall-clock.
type Key = (String, String, String, String, i64, String, u64, usize);

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
    (r.op.clone(), r.placement.clone(), r.dtype.clone(), r.redop.clone(), r.root, r.timing.clone(), r.size, r.ranks)
}

fn index(recs: &[Record]) -> BTreeMap<Key, &Record> {
    let p = primary(recs);
    recs.iter().filter(|r| Some(&r.backend) == p.as_ref()).map(|r| (key(r), r)).collect()
}

/// What a file's rows are: `float sum at 2 ranks (timing cuda-events)`, for the message when
/// nothing matches.
fn what(rows: &BTreeMap<Key, &Record>) -> String {
    let kinds: std::collections::BTreeSet<String> = rows
        .keys()
        .map(|k| {
            format!("{} {}{} at {} ranks (timing {})", k.2, k.3, if k.4 >= 0 { format!(" root {}", k.4) } else { String::new() }, k.7, k.5)
        })
        .collect();
    if kinds.is_empty() {
        "no rows".into()
    } else {
        kinds.into_iter().collect::<Vec<_>>().join(", ")
    }
}

/// The candidate / baseline ratio and what it is of: busbw, else algbw (one rank), else the
/// inverse time ratio; `None` when none can be formed.
fn ratio(a: &Record, b: &Record) -> Option<(f64, &'static str)> {
    let r = if a.busbw > 0.0 && b.busbw > 0.0 {
        (b.busbw / a.busbw, "busbw")
    } else if a.algbw > 0.0 {
        (b.algbw / a.algbw, "algbw")
    } else if b.time_us > 0.0 && a.time_us > 0.0 {
        (a.time_us / b.time_us, "time")
    } else {
        return None;
    };
    r.0.is_finite().then_some(r)
}

/// Wrong elements of a record, as a row's note: `3 wrong`, `2 wrong in warm-up`.
fn wrongs(r: &Record) -> Option<String> {
    let mut w = Vec::new();
    if r.wrong > 0 || r.wrong_iterations > 0 {
        w.push(format!("{} wrong", r.wrong.max(r.wrong_iterations)));
    }
    if r.wrong_warmup > 0 {
        w.push(format!("{} wrong in warm-up", r.wrong_warmup));
    }
    (!w.is_empty()).then(|| w.join(", "))
}

/// The table, and how many rows are flagged (below the threshold, wrong, missing or with no
/// ratio); an error when no row of the baseline has a candidate row to compare with (different
/// ops, sizes, dtype, reduce op, root or timing): a comparison of nothing must not pass as "0
/// rows below".
///
/// Rows match on op, placement, dtype, reduce op, root, timing, size and rank count; when each
/// file holds a single rank count, rows of different rank counts are matched too (shown `2/4`).
pub fn compare(base: &[Record], cand: &[Record], threshold: f64) -> Result<(String, usize), String> {
    let (a, b) = (index(base), index(cand));
    let ranks = |m: &BTreeMap<Key, &Record>| m.keys().map(|k| k.7).collect::<std::collections::BTreeSet<usize>>();
    let (ra_set, rb_set) = (ranks(&a), ranks(&b));
    let across = ra_set.len() == 1 && rb_set.len() == 1 && ra_set != rb_set;
    let other = rb_set.iter().next().copied().unwrap_or(0);
    let mut s = String::new();
    let (pa, pb) = (primary(base).unwrap_or_default(), primary(cand).unwrap_or_default());
    let _ = writeln!(s, "# busbw ratio {pb} (candidate) / {pa} (baseline); flagged below {threshold}, wrong or missing");
    let _ = writeln!(
        s,
        "# {:>14} {:>12} {:>8} {:>6} {:>5} {:>12} {:>10} {:>10} {:>7}  flag",
        "op", "placement", "type", "redop", "ranks", "size(B)", "base GB/s", "cand GB/s", "ratio"
    );
    let (mut below, mut wrong, mut missing, mut unratioed) = (0, 0, 0, 0);
    for (k, ra) in &a {
        let found = b.get(k).or_else(|| {
            let mut k2 = k.clone();
            k2.7 = other;
            across.then(|| b.get(&k2)).flatten()
        });
        let Some(rb) = found else {
            missing += 1;
            let _ = writeln!(
                s,
                "  {:>14} {:>12} {:>8} {:>6} {:>5} {:>12} {:>10.3} {:>10} {:>7}  MISSING (no candidate row)",
                k.0, k.1, k.2, k.3, ra.ranks, k.6, ra.busbw, "-", "-"
            );
            continue;
        };
        let r = ratio(ra, rb);
        let mut flags = Vec::new();
        match r {
            Some((x, _)) if x < threshold => {
                below += 1;
                flags.push("REGRESSION".to_string());
            }
            Some(_) => {}
            None => {
                unratioed += 1;
                flags.push("NO RATIO (no bandwidth or time on a side)".to_string());
            }
        }
        if let Some(w) = wrongs(rb) {
            wrong += 1;
            flags.push(format!("WRONG ({w})"));
        }
        if let Some(w) = wrongs(ra) {
            flags.push(format!("(baseline {w})"));
        }
        if let Some((_, by)) = r.filter(|(_, by)| *by != "busbw") {
            flags.push(format!("[{by}]"));
        }
        let _ = writeln!(
            s,
            "  {:>14} {:>12} {:>8} {:>6} {:>5} {:>12} {:>10.3} {:>10.3} {:>7}  {}",
            k.0,
            k.1,
            k.2,
            k.3,
            if ra.ranks == rb.ranks { ra.ranks.to_string() } else { format!("{}/{}", ra.ranks, rb.ranks) },
            k.6,
            ra.busbw,
            rb.busbw,
            r.map(|(x, _)| format!("{x:.3}")).unwrap_or_else(|| "-".into()),
            flags.join(" ")
        );
    }
    if a.len() == missing {
        return Err(format!(
            "nothing to compare: no row of the baseline ({}) has a row of the candidate ({}) with the same op, placement, \
             dtype, reduce op, root, timing, size and rank count",
            what(&a),
            what(&b)
        ));
    }
    let flagged = below + wrong + missing + unratioed;
    let _ = writeln!(
        s,
        "# {flagged} of {} rows flagged: {below} below {threshold}, {wrong} wrong, {missing} missing in the candidate, {unratioed} with no ratio",
        a.len()
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
        assert!(table.contains("1 of 2 rows flagged: 1 below 0.9"), "{table}");
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
        assert!(t.contains("0 of 2 rows flagged"), "{t}");
    }

    /// review11: a candidate fast because it is wrong, one that lost its large rows (it hung
    /// there), and a one-rank run (busbw 0: the ratio was NaN, and `NaN < threshold` is false)
    /// all passed as "0 rows below".
    #[test]
    fn compare_flags_wrong_missing_and_unratioed_rows() {
        let wrong = |r: Record, w: u64, warm: u64| Record { wrong: w, wrong_iterations: w.min(1), wrong_warmup: warm, ..r };
        let base =
            vec![sample("shm", "all_reduce", 1024, 1.0), sample("shm", "all_reduce", 2048, 1.0), sample("shm", "all_reduce", 4096, 1.0)];
        // 1024: faster but wrong in a timed iteration; 2048: wrong in a warm-up only; 4096: missing.
        let cand = vec![wrong(sample("shm", "all_reduce", 1024, 5.0), 3, 0), wrong(sample("shm", "all_reduce", 2048, 1.0), 0, 2)];
        let (t, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 3, "{t}");
        let row =
            |size: &str| t.lines().find(|l| l.contains(&format!(" {size} "))).unwrap_or_else(|| panic!("no row {size}: {t}")).to_string();
        assert!(row("1024").contains("WRONG") && row("1024").contains("3 wrong"), "{t}");
        assert!(row("2048").contains("WRONG") && row("2048").contains("2 wrong in warm-up"), "{t}");
        assert!(row("4096").contains("MISSING"), "{t}");
        assert!(t.contains("3 of 3 rows flagged: 0 below 0.9, 2 wrong, 1 missing"), "{t}");
        // One rank: busbw is 0 on both sides; the ratio falls back to algbw, never NaN.
        let one = |r: Record, algbw: f64| Record { ranks: 1, busbw: 0.0, algbw, ..r };
        let base = vec![one(sample("shm", "all_reduce", 1024, 1.0), 2.0)];
        let cand = vec![one(sample("shm", "all_reduce", 1024, 1.0), 1.0)];
        let (t, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 1, "{t}");
        assert!(row_of(&t, "1024").contains("0.500") && row_of(&t, "1024").contains("algbw"), "{t}");
        // A baseline wrong is named too (its speed is no reference), the row still compared.
        let base = vec![wrong(sample("shm", "all_reduce", 1024, 1.0), 4, 0)];
        let cand = vec![sample("shm", "all_reduce", 1024, 1.0)];
        let (t, flagged) = compare(&base, &cand, 0.9).unwrap();
        assert_eq!(flagged, 0, "{t}");
        assert!(row_of(&t, "1024").contains("baseline 4 wrong"), "{t}");
        // Another root or another timing is another row, never set against this one.
        let rooted = |r: Record, root: i64, timing: &str| Record { op: "broadcast".into(), root, timing: timing.into(), ..r };
        let base = vec![rooted(sample("shm", "broadcast", 1024, 1.0), 0, "test")];
        let e = compare(&base, &[rooted(sample("shm", "broadcast", 1024, 1.0), 1, "test")], 0.9).unwrap_err();
        assert!(e.contains("nothing to compare"), "{e}");
        let e = compare(&base, &[rooted(sample("shm", "broadcast", 1024, 1.0), 0, "cuda-events")], 0.9).unwrap_err();
        assert!(e.contains("nothing to compare") && e.contains("cuda-events"), "{e}");
    }

    fn row_of(t: &str, size: &str) -> String {
        t.lines().find(|l| l.contains(&format!(" {size} "))).unwrap_or_else(|| panic!("no row {size}: {t}")).to_string()
    }
}
