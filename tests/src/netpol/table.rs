//! The printout of a probed matrix, in the style of upstream's "reachability" tables: one table
//! per target, a row per client (from), a column per server (to); `.` connected, `X` did not,
//! `-` not probed (a pod to itself), and a `*` after every cell that is not what was expected.
use std::fmt::Write as _;

use super::{expect::Reachability, model::Target};

/// `observed` against `expected`, every target's table.
pub fn render(expected: &Reachability, observed: &Reachability) -> String {
    let mut out = String::new();
    let wrong = wrong_cells(expected, observed);
    let _ = writeln!(
        out,
        "reachability: {} probes, {} wrong ('.' connected, 'X' did not, '*' not as expected; rows from, columns to)",
        expected.cells.len(),
        wrong.len()
    );
    for target in expected.targets() {
        out.push_str(&one_table(expected, observed, target));
    }
    out
}

fn one_table(expected: &Reachability, observed: &Reachability, target: Target) -> String {
    let mut out = format!("{target}:\n{:6}", "");
    for to in &expected.pods {
        let _ = write!(out, "{:6}", to.to_string());
    }
    out.push('\n');
    for &from in &expected.pods {
        let _ = write!(out, "{:6}", from.to_string());
        for &to in &expected.pods {
            let cell = match (expected.get(from, to, target), observed.get(from, to, target)) {
                (Some(want), Some(got)) => {
                    format!("{}{}", if got { '.' } else { 'X' }, if want == got { "" } else { "*" })
                }
                _ => "-".to_string(),
            };
            let _ = write!(out, "{cell:6}");
        }
        out.push('\n');
    }
    out
}

/// The cells of `observed` that differ from `expected` (a cell missing counts as wrong).
pub fn wrong_cells(expected: &Reachability, observed: &Reachability) -> Vec<String> {
    expected
        .cells
        .iter()
        .filter(|(key, want)| observed.cells.get(key) != Some(want))
        .map(|((from, to, target), want)| {
            format!("{from} → {to} {target}: expected {}", if *want { "allowed" } else { "denied" })
        })
        .collect()
}
