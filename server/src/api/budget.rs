//! Each node's budget of secret requests at the broker (`api::secrets`),
//! sans-IO: time is a parameter.

/// Secret requests one node may make at once (every secret of every
/// allocation after a restart, say) ...
pub const BURST: u32 = 32;
/// ... then one each this long: a node whose key was taken can neither
/// keep the broker busy nor fill the fleet's events with deliveries.
pub const REFILL_MS: u64 = 10_000;
/// Nodes remembered at most; past it, those whose budget is whole again
/// are forgotten (they would start whole anyway).
const MAX_REMEMBERED: usize = 100_000;

/// Each node's budget of secret requests, sans-IO: time is a parameter.
#[derive(Debug, Default)]
pub struct PerNode {
    /// Node → (requests left, when last counted, ms).
    budgets: std::sync::Mutex<std::collections::HashMap<String, (f64, u64)>>,
}

impl PerNode {
    /// Takes one request from `node`'s budget at `now_ms`; `Err` with the
    /// milliseconds until the next one is due.
    pub fn take(&self, node: &str, now_ms: u64) -> Result<(), u64> {
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        let refill = |(left, at): (f64, u64)| {
            let gained = now_ms.saturating_sub(at) as f64 / REFILL_MS as f64;
            ((left + gained).min(f64::from(BURST)), at.max(now_ms))
        };
        if budgets.len() >= MAX_REMEMBERED && !budgets.contains_key(node) {
            budgets.retain(|_, b| refill(*b).0 < f64::from(BURST));
        }
        let (left, at) = budgets
            .get(node)
            .copied()
            .map_or((f64::from(BURST), now_ms), refill);
        if left >= 1.0 {
            budgets.insert(node.to_string(), (left - 1.0, at));
            Ok(())
        } else {
            budgets.insert(node.to_string(), (left, at));
            Err(((1.0 - left) * REFILL_MS as f64).ceil() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_gets_its_burst_then_one_each_refill() {
        let p = PerNode::default();
        for _ in 0..BURST {
            assert_eq!(p.take("n1", 1_000), Ok(()));
        }
        assert_eq!(p.take("n1", 1_000), Err(REFILL_MS));
        assert_eq!(p.take("n1", 1_000 + REFILL_MS / 2), Err(REFILL_MS / 2));
        // Another node has its own.
        assert_eq!(p.take("n2", 1_000), Ok(()));
        assert_eq!(p.take("n1", 1_000 + REFILL_MS), Ok(()));
        assert_eq!(p.take("n1", 1_000 + REFILL_MS), Err(REFILL_MS));
        // A clock stepped back gains nothing and loses nothing.
        assert_eq!(p.take("n1", 0), Err(REFILL_MS));
        assert_eq!(p.take("n1", 1_000 + 2 * REFILL_MS), Ok(()));
        // Quiet long enough, the whole burst again, and no more.
        let later = 1_000 + 1_000 * REFILL_MS;
        for _ in 0..BURST {
            assert_eq!(p.take("n1", later), Ok(()));
        }
        assert!(p.take("n1", later).is_err());
        // Far ends of time: no overflow.
        assert!(p.take("n3", u64::MAX).is_ok());
        assert!(p.take("n3", 0).is_ok());
    }

    #[test]
    fn past_the_bound_only_nodes_with_spent_budgets_are_remembered() {
        let p = PerNode::default();
        for i in 0..MAX_REMEMBERED {
            assert!(p.take(&format!("n{i}"), 0).is_ok());
        }
        // n0 spends all it has; everyone else is whole again by now.
        let now = 10 * REFILL_MS;
        while p.take("n0", now).is_ok() {}
        assert!(p.take("newcomer", now).is_ok());
        let budgets = p.budgets.lock().unwrap();
        assert_eq!(budgets.len(), 2, "n0 and the newcomer");
        assert!(budgets.contains_key("n0"));
    }
}
