//! A small seeded generator for jitter, so decisions are reproducible.

/// SplitMix64: tiny, fast, and good enough for back-off jitter. The shell
/// seeds it from the operating system; tests and the simulator seed it from
/// their own seed, so the same seed gives the same schedule.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value uniformly distributed in `0..=max`.
    pub fn below_inclusive(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        // Multiply-shift keeps the bias below 2^-64 per draw, far below what
        // matters for jitter.
        ((u128::from(self.next_u64()) * (u128::from(max) + 1)) >> 64) as u64
    }
}
