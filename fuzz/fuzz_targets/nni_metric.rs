//! The NNI metric decoders of the `local` training service: the 2.x `.nni/metrics` record
//! framing (`ME` + 6-digit length + JSON + `\n`, `nni_file::NniRecordDecoder`) and the record
//! decoder both NNI channels share (`nni_file::decode_nni_metric`; the v3 HTTP channel hands it
//! a message body, the file channel each record).
//!
//! Any bytes give records or errors, never a panic or a hang. The file arrives in pieces of any
//! size, so the input is fed whole and in chunks (sizes from the first byte): both must find
//! the same metric records and the same number of corrupt ones. And records framed as nni
//! frames them (the input's lines as bodies, whatever bytes they hold) read back exactly.
#![no_main]

use knob_plugin_api::metric::default_value;
use knob_training_services::nni_file::{decode_nni_metric, NniMetric, NniRecord, NniRecordDecoder};
use libfuzzer_sys::fuzz_target;

const TRIAL: &str = "Ab1cD";

/// What a feed found: metric record bodies, with `None` for a corrupt stretch.
fn records(chunks: impl Iterator<Item = Vec<u8>>) -> Vec<Option<Vec<u8>>> {
    let mut decoder = NniRecordDecoder::new();
    let mut found = Vec::new();
    let mut on_record = |record: NniRecord<'_>| match record {
        NniRecord::Metric(body) => found.push(Some(body.to_vec())),
        NniRecord::Corrupt(why) => {
            assert!(!why.is_empty());
            found.push(None)
        }
    };
    for chunk in chunks {
        decoder.feed(&chunk, &mut on_record);
    }
    decoder.finish(&mut on_record);
    found
}

fn decode(body: &[u8]) {
    match decode_nni_metric(body, TRIAL) {
        Ok(NniMetric::Value(_kind, value)) => {
            // What the core does with it next; an error is fine, a panic is not.
            let _ = default_value(&value);
        }
        Ok(NniMetric::Unreadable(_kind, value, why)) => {
            assert!(!why.is_empty());
            assert!(default_value(&value).is_err());
        }
        Ok(NniMetric::NotAMetric) => {}
        Err(why) => assert!(!why.is_empty()),
    }
}

fuzz_target!(|data: &[u8]| {
    // As a v3 channel message body.
    decode(data);

    // As the bytes of `.nni/metrics`.
    let whole = records(std::iter::once(data.to_vec()));
    for body in whole.iter().flatten() {
        decode(body);
    }
    if let Some((&first, rest)) = data.split_first() {
        let size = usize::from(first % 16) + 1;
        let chunked = records(rest.chunks(size).map(<[u8]>::to_vec));
        let whole_rest = records(std::iter::once(rest.to_vec()));
        assert_eq!(
            chunked, whole_rest,
            "fed in chunks of {size} bytes, the file reads differently"
        );

        // nni's `send_metric`: b'ME%06d%b' % (len(data), data) with data = metric + '\n'.
        // (nni asserts a record is under 1 000 000 bytes; its length has 6 digits.)
        let bodies: Vec<&[u8]> = rest
            .split(|&b| b == b'\n')
            .filter(|body| body.len() < 999_999)
            .collect();
        let mut file = Vec::new();
        for body in &bodies {
            file.extend_from_slice(format!("ME{:06}", body.len() + 1).as_bytes());
            file.extend_from_slice(body);
            file.push(b'\n');
        }
        let read = records(file.chunks(size).map(<[u8]>::to_vec));
        let expected: Vec<Option<Vec<u8>>> = bodies.iter().map(|b| Some(b.to_vec())).collect();
        assert_eq!(
            read, expected,
            "nni's records, fed in chunks of {size} bytes"
        );
    }
});
