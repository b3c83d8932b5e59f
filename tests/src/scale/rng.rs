//! A small seeded generator (xorshift64*) for the scale run's random choices: which verbs die
//! and when. The seed is printed, and `EBPF_CNI_SEED` replays a run's choices.
pub struct Rng {
    state: u64,
    seed: u64,
}

impl Rng {
    /// Seeded from `EBPF_CNI_SEED`, else from the clock.
    pub fn from_env() -> Self {
        let seed = std::env::var("EBPF_CNI_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            now.as_nanos() as u64
        });
        Self::seeded(seed)
    }

    pub fn seeded(seed: u64) -> Self {
        // Zero would stay zero forever.
        Self { state: seed.max(1), seed }
    }

    /// What replays this run: `EBPF_CNI_SEED=<seed>`.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [0, 1).
    pub fn fraction(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True once in `n` draws on average (never for `n` = 0).
    pub fn one_in(&mut self, n: u32) -> bool {
        n > 0 && self.below(u64::from(n)) == 0
    }
}
