//! The keys a backend keeps loaded between calls, so that a join (EK, AK,
//! activation, node key, certification) derives each primary key once.
//! Small on purpose: some TPMs (swtpm among them) hold three transient
//! objects, and a command needs two at most.

use crate::public::{EkKind, PublicArea};

/// Transient objects kept loaded at most.
const MAX_TRANSIENT: usize = 2;

/// Which key a loaded object is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Slot {
    Ek(EkKind),
    Ak,
    Node([u8; 32]),
}

#[derive(Debug)]
struct Loaded<H> {
    slot: Slot,
    handle: H,
    /// False for a persistent object, which is never flushed.
    transient: bool,
    public: PublicArea,
}

#[derive(Debug)]
pub(crate) struct HandleCache<H> {
    entries: Vec<Loaded<H>>,
}

impl<H: Copy> HandleCache<H> {
    pub(crate) fn new() -> Self {
        HandleCache {
            entries: Vec::new(),
        }
    }

    pub(crate) fn get(&self, slot: &Slot) -> Option<(H, PublicArea)> {
        self.entries
            .iter()
            .find(|e| &e.slot == slot)
            .map(|e| (e.handle, e.public.clone()))
    }

    /// The transient handles to flush so that one more object fits,
    /// keeping the slots in `keep` (the others a command needs).
    pub(crate) fn make_room(&mut self, keep: &[Slot]) -> Vec<H> {
        let mut out = Vec::new();
        while self.entries.iter().filter(|e| e.transient).count() >= MAX_TRANSIENT {
            let Some(i) = self
                .entries
                .iter()
                .position(|e| e.transient && !keep.contains(&e.slot))
            else {
                break;
            };
            out.push(self.entries.remove(i).handle);
        }
        out
    }

    pub(crate) fn insert(&mut self, slot: Slot, handle: H, transient: bool, public: PublicArea) {
        self.entries.retain(|e| e.slot != slot);
        self.entries.push(Loaded {
            slot,
            handle,
            transient,
            public,
        });
    }

    /// Forgets every entry; returns the transient handles to flush.
    pub(crate) fn drain(&mut self) -> Vec<H> {
        self.entries
            .drain(..)
            .filter(|e| e.transient)
            .map(|e| e.handle)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::public::ak_template;

    #[test]
    fn room_is_made_from_the_oldest_unneeded_transient() {
        let public = PublicArea::from_tpmt(&ak_template()).unwrap();
        let mut c = HandleCache::new();
        c.insert(
            Slot::Ek(EkKind::Rsa2048),
            0x8101_0001u32,
            false,
            public.clone(),
        );
        c.insert(Slot::Ak, 0x8000_0000, true, public.clone());
        assert!(c.make_room(&[]).is_empty());
        c.insert(Slot::Node([1; 32]), 0x8000_0001, true, public.clone());
        assert_eq!(c.make_room(&[Slot::Ak]), vec![0x8000_0001]);
        c.insert(Slot::Node([2; 32]), 0x8000_0002, true, public.clone());
        assert_eq!(
            c.make_room(&[Slot::Ak, Slot::Node([2; 32])]),
            Vec::<u32>::new()
        );
        assert_eq!(c.get(&Slot::Ak).map(|g| g.0), Some(0x8000_0000));
        assert_eq!(c.drain(), vec![0x8000_0000, 0x8000_0002]);
        assert!(c.get(&Slot::Ek(EkKind::Rsa2048)).is_none());
    }
}
