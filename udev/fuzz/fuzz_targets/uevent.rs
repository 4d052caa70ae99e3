//! Uevents come from the kernel or from any process with CAP_NET_ADMIN:
//! parsing must return an error, never panic, whatever the bytes, and an
//! event it accepts must encode (in both formats) to bytes that parse back
//! to the same event.
#![no_main]

use bcd_udev::{Message, interest, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = parse(data) {
        let event = message.uevent();
        assert_eq!(parse(&event.encode()), Ok(Message::Kernel(event.clone())));
        assert_eq!(parse(&event.encode_udev()), Ok(Message::Udev(event.clone())));
        let _ = interest(event);
    }
});
