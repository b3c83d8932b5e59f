//! The count a test file keeps over its cases: probes run, probes wrong, cases that failed.
#[derive(Debug, Default)]
pub struct Tally {
    pub cases: usize,
    pub probes: usize,
    pub wrong: usize,
    /// `case: what went wrong`, one per failed check or panic.
    pub failed: Vec<String>,
    /// `case: how long the last check took to see the expected matrix`.
    pub timings: Vec<String>,
}

impl Tally {
    /// The closing line: `netpol: N cases × M probes, W wrong`.
    pub fn summary(&self) -> String {
        format!("netpol: {} cases × {} probes, {} wrong", self.cases, self.probes, self.wrong)
    }
}
