//! The image reader takes bytes from anywhere: it must return an error,
//! never panic, whatever they are.
#![no_main]

use initramfs::Reader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Reader::new().max_unpacked(16 << 20).read(data);
});
