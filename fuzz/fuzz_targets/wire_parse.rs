//! The probe wire parser is a pure function of bytes: it must never panic,
//! and whatever it accepts must encode back to an equivalent message.
#![no_main]
use clockmesh_core::wire::{AuthKey, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = AuthKey::new(b"fuzzing-key-0123456789".to_vec()).expect("long enough");
    for k in [None, Some(&key)] {
        if let Ok(msg) = parse(data, k) {
            let again = parse(&msg.encode(k), k).expect("re-encoded message parses");
            assert_eq!(again.header().seq, msg.header().seq);
            assert_eq!(again.header().kind, msg.header().kind);
        }
    }
});
