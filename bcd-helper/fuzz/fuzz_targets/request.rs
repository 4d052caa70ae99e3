//! Everything a helper reads comes from a peer it does not trust: the
//! handshake, then a stream of frames, each decoded and validated. Whatever
//! the bytes, nothing panics, a frame over the limit is refused from its
//! header alone, and a request the helper accepts encodes to a frame that
//! decodes to the same request.
#![no_main]

use bcd_helper::{frame, request, wire};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = frame::decode::<wire::Hello>("Hello", data);
    let mut rest = data;
    loop {
        match frame::split(rest, frame::MAX_FRAME) {
            Ok(Some((body, used))) => {
                if let Ok(req) = request::decode(body) {
                    let again =
                        frame::encode(&req.to_wire()).expect("an accepted request fits a frame");
                    let (body, _) = frame::split(&again, frame::MAX_FRAME)
                        .expect("our own frame")
                        .expect("a whole frame");
                    assert_eq!(request::decode(body).as_ref(), Ok(&req));
                }
                rest = &rest[used..];
            }
            Ok(None) => break,
            Err(frame::FrameError::TooLarge { len, max }) => {
                assert!(len > max);
                break;
            }
            Err(e) => panic!("split fails only on size: {e}"),
        }
    }
});
