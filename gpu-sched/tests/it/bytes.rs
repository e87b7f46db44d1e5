use expect_test::{expect, Expect};
use knob_gpu_sched::ByteSize;

fn check_parse(inputs: &[&str], expected: Expect) {
    let rendered: Vec<String> = inputs
        .iter()
        .map(|input| match input.parse::<ByteSize>() {
            Ok(size) => format!("{input:?} -> {} B = {size}", size.bytes()),
            Err(error) => format!("{input:?} -> {error}"),
        })
        .collect();
    expected.assert_eq(&(rendered.join("\n") + "\n"));
}

#[test]
fn parses_binary_units_in_any_spelling() {
    check_parse(
        &[
            "10GiB", "10 GB", "10g", "512mb", "1.5GiB", "0.1TiB", "80GiB", "4096", "7 B", "2TB",
        ],
        expect![[r#"
            "10GiB" -> 10737418240 B = 10 GiB
            "10 GB" -> 10737418240 B = 10 GiB
            "10g" -> 10737418240 B = 10 GiB
            "512mb" -> 536870912 B = 512 MiB
            "1.5GiB" -> 1610612736 B = 1.5 GiB
            "0.1TiB" -> 109951162777 B = 102.4 GiB
            "80GiB" -> 85899345920 B = 80 GiB
            "4096" -> 4096 B = 4 KiB
            "7 B" -> 7 B = 7 B
            "2TB" -> 2199023255552 B = 2 TiB
        "#]],
    );
}

#[test]
fn rejects_what_is_not_a_size() {
    check_parse(
        &[
            "",
            "GiB",
            "ten GiB",
            "1.2.3GiB",
            "5 parsecs",
            "-1GiB",
            "1.GiB",
            "99999999999TiB",
        ],
        expect![[r#"
            "" -> cannot read `` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "GiB" -> cannot read `GiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "ten GiB" -> cannot read `ten GiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "1.2.3GiB" -> cannot read `1.2.3GiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "5 parsecs" -> cannot read `5 parsecs` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "-1GiB" -> cannot read `-1GiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "1.GiB" -> cannot read `1.GiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
            "99999999999TiB" -> cannot read `99999999999TiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB
        "#]],
    );
}

#[test]
fn deserializes_from_count_or_text_and_serializes_as_count() {
    let from_text: ByteSize = serde_json::from_str("\"24GiB\"").unwrap();
    let from_count: ByteSize = serde_json::from_str("25769803776").unwrap();
    assert_eq!(from_text, from_count);
    assert_eq!(serde_json::to_string(&from_text).unwrap(), "25769803776");
    let error = serde_json::from_str::<ByteSize>("\"lots\"").unwrap_err();
    assert!(
        error.to_string().contains("cannot read `lots` as a size"),
        "{error}"
    );
}
