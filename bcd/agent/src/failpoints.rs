//! Failpoints: named boundaries in command handling and self-update where
//! a test build can make the daemon die, as a kill -9 would, to prove that
//! what was made durable before the boundary is enough.
//!
//! The agent calls [`Failpoints::at`] at each [`Point`]. Without the
//! `failpoints` cargo feature that call does nothing and nothing can arm it:
//! no environment variable is read and none of this module's arming code is
//! in the binary (release builds never enable the feature; `scripts/test`
//! checks the static `bcd`). With the feature, `bcd` arms it from the
//! environment ([`Failpoints::from_env`]):
//! `BCD_CRASH_AT=after-accept,mid-effect` aborts at those points, each time
//! with probability `BCD_CRASH_PROBABILITY` (default 1), drawn from
//! `BCD_CRASH_SEED` (default: random). The abort is real
//! (`std::process::abort`): no destructors, no flushing.

/// The boundaries, in the order a command passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// The command is journaled `accepted`; nothing else happened.
    AfterAccept,
    /// Journaled `running` with the boot id; the side effect has not begun.
    AfterRunning,
    /// The side effect finished; its result is not journaled.
    MidEffect,
    /// The result is journaled; it has not been sent.
    AfterResult,
    /// The server acknowledged the result; the journal does not know yet.
    BeforeAck,
    /// Self-update: the link names the new slot; the restart has not
    /// happened.
    AfterSwitch,
}

impl Point {
    pub const ALL: [Point; 6] = [
        Point::AfterAccept,
        Point::AfterRunning,
        Point::MidEffect,
        Point::AfterResult,
        Point::BeforeAck,
        Point::AfterSwitch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Point::AfterAccept => "after-accept",
            Point::AfterRunning => "after-running",
            Point::MidEffect => "mid-effect",
            Point::AfterResult => "after-result",
            Point::BeforeAck => "before-ack",
            Point::AfterSwitch => "after-switch",
        }
    }

    pub fn parse(name: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Where the daemon may be made to die. [`Failpoints::none`] (the only
/// value a build without the `failpoints` feature can make) never fires.
#[derive(Debug, Default)]
pub struct Failpoints {
    #[cfg(feature = "failpoints")]
    armed: Option<armed::Armed>,
}

impl Failpoints {
    /// Nothing armed.
    pub fn none() -> Failpoints {
        Failpoints::default()
    }

    /// Armed from `BCD_CRASH_AT`, `BCD_CRASH_PROBABILITY` and
    /// `BCD_CRASH_SEED`; nothing armed without `BCD_CRASH_AT`.
    #[cfg(feature = "failpoints")]
    pub fn from_env() -> Result<Failpoints, String> {
        armed::Armed::from_env().map(|armed| Failpoints { armed })
    }

    /// Aborts the process here if this point is armed and the draw says so.
    #[inline]
    pub fn at(&mut self, point: Point) {
        #[cfg(feature = "failpoints")]
        if let Some(a) = &mut self.armed {
            a.at(point);
        }
        #[cfg(not(feature = "failpoints"))]
        let _ = point;
    }
}

#[cfg(feature = "failpoints")]
mod armed {
    use super::Point;
    use bcd_core::SplitMix64;

    #[derive(Debug)]
    pub(super) struct Armed {
        points: Vec<Point>,
        probability: f64,
        rng: SplitMix64,
    }

    impl Armed {
        pub(super) fn from_env() -> Result<Option<Armed>, String> {
            let Ok(list) = std::env::var("BCD_CRASH_AT") else {
                return Ok(None);
            };
            let points = parse_points(&list)?;
            let probability = match std::env::var("BCD_CRASH_PROBABILITY") {
                Ok(v) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| {
                        format!("BCD_CRASH_PROBABILITY={v} is not a probability (0 to 1)")
                    })?,
                Err(_) => 1.0,
            };
            let seed = match std::env::var("BCD_CRASH_SEED") {
                Ok(v) => v
                    .parse()
                    .map_err(|_| format!("BCD_CRASH_SEED={v} is not a number"))?,
                Err(_) => rand::random(),
            };
            Ok(Some(Armed {
                points,
                probability,
                rng: SplitMix64::new(seed),
            }))
        }

        pub(super) fn at(&mut self, point: Point) {
            if self.points.contains(&point) {
                let draw = self.rng.next_u64() as f64 / u64::MAX as f64;
                if draw < self.probability {
                    eprintln!("crash injection: aborting at {}", point.name());
                    std::process::abort();
                }
            }
        }
    }

    pub(super) fn parse_points(list: &str) -> Result<Vec<Point>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                Point::parse(s).ok_or_else(|| {
                    let known: Vec<&str> = Point::ALL.iter().map(|p| p.name()).collect();
                    format!(
                        "BCD_CRASH_AT names {s:?}, which is not a failpoint (known: {})",
                        known.join(", ")
                    )
                })
            })
            .collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn points_parse_and_unknown_ones_are_named() {
            assert_eq!(
                parse_points("after-accept, mid-effect,").unwrap(),
                [Point::AfterAccept, Point::MidEffect]
            );
            let e = parse_points("after-acept").unwrap_err();
            assert!(
                e.contains("\"after-acept\"") && e.contains("after-accept"),
                "{e}"
            );
        }

        #[test]
        fn an_unarmed_point_never_fires() {
            let mut a = Armed {
                points: vec![Point::AfterSwitch],
                probability: 1.0,
                rng: SplitMix64::new(1),
            };
            // Would abort the test process if it fired.
            a.at(Point::AfterAccept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Point::ALL {
            assert_eq!(Point::parse(p.name()), Some(p));
        }
        assert_eq!(Point::parse("nowhere"), None);
        // Nothing armed: every point passes.
        let mut f = Failpoints::none();
        for p in Point::ALL {
            f.at(p);
        }
    }
}
