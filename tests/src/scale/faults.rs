//! SIGKILL at random points of ADD and DEL. A verb chosen to die is killed either at one of the
//! plugin's named crash points (debug builds, see `crash.rs`) or by a timer at a random moment
//! of its usual run time (any build: the bench runs release binaries). Afterwards the runtime
//! either sends DEL, as containerd and CRI-O do after a failed ADD, or forgets the attachment
//! (a runtime that crashed too): then only GC can clean it up.
use std::{sync::Mutex, time::Duration};

use anyhow::Result;
use serde_json::Value;

use super::rng::Rng;
use crate::{CniOutput, Testbed, crash};

/// How the verbs died, and what followed.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub adds_killed: usize,
    pub dels_killed: usize,
    /// Of those, killed at a named crash point (the rest by the timer).
    pub at_crash_points: usize,
    /// Killed verbs the runtime followed with a DEL.
    pub followed_by_del: usize,
    /// Killed verbs whose attachment was forgotten: GC's work.
    pub left_to_gc: usize,
}

impl Tally {
    pub fn killed(&self) -> usize {
        self.adds_killed + self.dels_killed
    }
}

enum Fate {
    Live,
    DieAt(&'static str),
    KilledAfter(Duration),
}

pub struct Killer {
    rng: Mutex<Rng>,
    /// One verb in this many dies (0: none).
    one_in: u32,
    crash_points: bool,
    /// A recent successful run time of ADD and of DEL: timed kills land within it.
    usual: Mutex<[Duration; 2]>,
    tally: Mutex<Tally>,
}

impl Killer {
    /// Kills one verb in `one_in` of those run through [`Killer::run`] on `tb`'s plugin.
    pub fn new(rng: Rng, one_in: u32, tb: &Testbed) -> Result<Self> {
        Ok(Self {
            rng: Mutex::new(rng),
            one_in,
            crash_points: tb.plugin.has_crash_points()?,
            usual: Mutex::new([Duration::from_millis(20); 2]),
            tally: Mutex::new(Tally::default()),
        })
    }

    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs `verb` for `pod` with `conf` and the variables `more`, maybe killing it; `killed_by`
    /// is `Some(9)` if it died.
    pub fn run(&self, tb: &Testbed, verb: &str, pod: usize, conf: &Value, more: &[(&str, &str)]) -> Result<CniOutput> {
        let is_add = verb == "ADD";
        let fate = self.fate(is_add);
        let named = matches!(fate, Fate::DieAt(_));
        let out = match fate {
            Fate::Live => tb.cni_env(verb, pod, conf, &tb.sandbox(pod).netns, more)?,
            Fate::DieAt(step) => {
                let mut more = more.to_vec();
                more.push(("EBPF_CNI_DIE_AT", step));
                tb.cni_env(verb, pod, conf, &tb.sandbox(pod).netns, &more)?
            }
            Fate::KilledAfter(after) => tb.cni_killed_after(verb, pod, conf, more, after)?,
        };
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        if out.killed_by == Some(libc::SIGKILL) {
            *if is_add { &mut tally.adds_killed } else { &mut tally.dels_killed } += 1;
            tally.at_crash_points += usize::from(named);
        } else if out.success {
            // A moving average, so that timed kills follow the run time as the node fills.
            let mut usual = self.usual.lock().unwrap_or_else(|e| e.into_inner());
            let slot = &mut usual[usize::from(!is_add)];
            *slot = (*slot * 7 + out.elapsed) / 8;
        }
        Ok(out)
    }

    /// After a kill: true if the runtime sends DEL now, false if it forgets the attachment.
    pub fn follow_up(&self) -> bool {
        let del = self.rng.lock().unwrap_or_else(|e| e.into_inner()).one_in(2);
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        *if del { &mut tally.followed_by_del } else { &mut tally.left_to_gc } += 1;
        del
    }

    /// Whether and how the next verb dies: at a crash point (half the time, when the build has
    /// them), else at a uniform moment of the verb's usual run time.
    fn fate(&self, is_add: bool) -> Fate {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        if !rng.one_in(self.one_in) {
            return Fate::Live;
        }
        if self.crash_points && rng.one_in(2) {
            let steps: &[&'static str] = if is_add { &crash::ADD_STEPS } else { &crash::DEL_STEPS };
            return Fate::DieAt(steps[rng.below(steps.len() as u64) as usize]);
        }
        let usual = self.usual.lock().unwrap_or_else(|e| e.into_inner())[usize::from(!is_add)];
        Fate::KilledAfter(usual.mul_f64(rng.fraction()))
    }
}
