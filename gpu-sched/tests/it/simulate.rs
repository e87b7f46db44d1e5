use expect_test::{expect, Expect};
use knob_gpu_sched::probe::SimulatedInventory;

/// Renders the environments a spec yields, one line each, or the parse error.
fn check(spec: &str, expected: Expect) {
    let rendered = match SimulatedInventory::parse(spec) {
        Err(error) => format!("{error}\n"),
        Ok(inventory) => inventory
            .environments("local", None)
            .iter()
            .map(|env| {
                let gpus: Vec<String> = env
                    .gpus
                    .iter()
                    .map(|gpu| format!("{}:{}", gpu.index, gpu.memory_total))
                    .collect();
                format!(
                    "{} host={} cpu={} mem={} gpus=[{}]\n",
                    env.id,
                    env.host,
                    env.host_resources.cpu_count,
                    env.host_resources.memory_total,
                    gpus.join(", ")
                )
            })
            .collect(),
    };
    expected.assert_eq(&rendered);
}

#[test]
fn one_machine() {
    check(
        "4x80GiB",
        expect![[r#"
            local host=localhost cpu=16 mem=64 GiB gpus=[0:80 GiB, 1:80 GiB, 2:80 GiB, 3:80 GiB]
        "#]],
    );
}

#[test]
fn mixed_groups_with_host_figures() {
    check(
        " 2x80GiB, 2x40GiB ,cpu=32,mem=256GiB ",
        expect![[r#"
            local host=localhost cpu=32 mem=256 GiB gpus=[0:80 GiB, 1:80 GiB, 2:40 GiB, 3:40 GiB]
        "#]],
    );
}

#[test]
fn several_named_machines() {
    check(
        "node1=8x80GiB,mem=512GiB;node2=2x24GiB;cpu-box=cpu=64",
        expect![[r#"
            node1 host=node1 cpu=16 mem=512 GiB gpus=[0:80 GiB, 1:80 GiB, 2:80 GiB, 3:80 GiB, 4:80 GiB, 5:80 GiB, 6:80 GiB, 7:80 GiB]
            node2 host=node2 cpu=16 mem=64 GiB gpus=[0:24 GiB, 1:24 GiB]
            cpu-box host=cpu-box cpu=64 mem=64 GiB gpus=[]
        "#]],
    );
}

#[test]
fn errors_say_what_to_write() {
    check(
        "",
        expect![[r#"
            cannot read simulated GPU spec ``: it is empty; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "4x80GiB;2x40GiB",
        expect![[r#"
            cannot read simulated GPU spec `4x80GiB;2x40GiB`: several environments need a name each (`name=4x80GiB`); write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "a=1x8GiB;a=1x8GiB",
        expect![[r#"
            cannot read simulated GPU spec `a=1x8GiB;a=1x8GiB`: environment a appears twice; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "4x",
        expect![[r#"
            cannot read simulated GPU spec `4x`: `4x` needs a memory size after the x; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "0x80GiB",
        expect![[r#"
            cannot read simulated GPU spec `0x80GiB`: `0x80GiB` needs a GPU count above 0 before the x; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "4*80GiB",
        expect![[r#"
            cannot read simulated GPU spec `4*80GiB`: `4*80GiB` is neither COUNTxSIZE, cpu=N nor mem=SIZE; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "1000000x80GiB",
        expect![[r#"
            cannot read simulated GPU spec `1000000x80GiB`: `1000000x80GiB` takes the spec past 4096 GPUs, the most that can be simulated; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    // The bound is over the whole spec, groups and environments together.
    check(
        "a=4000x8GiB;b=90x8GiB,7x8GiB",
        expect![[r#"
            cannot read simulated GPU spec `a=4000x8GiB;b=90x8GiB,7x8GiB`: `7x8GiB` takes the spec past 4096 GPUs, the most that can be simulated; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
    check(
        "cpu=lots",
        expect![[r#"
            cannot read simulated GPU spec `cpu=lots`: `cpu=lots` needs a whole number of cores above 0; write e.g. `4x80GiB` or `node1=8x80GiB,cpu=64,mem=512GiB;node2=2x24GiB`
        "#]],
    );
}

/// Numbers too large for the parser's integers are called too large (they were "needs a GPU
/// count above 0" or "needs a memory size", with one there); a size without a unit, which is
/// bytes, and a machine of no memory are refused, as `4x0` and `cpu=0` are.
#[test]
fn too_large_bare_and_zero_sizes_say_what_is_wrong() {
    let bad = [
        "99999999999999999999x1GiB",
        "1x20EiB",
        "1x99999999999TiB",
        "cpu=99999999999",
        "mem=0GiB",
        "4x80",
        "mem=512",
    ];
    let lines: Vec<String> = bad
        .iter()
        .map(|spec| match SimulatedInventory::parse(spec) {
            Err(e) => e
                .to_string()
                .split("; write e.g.")
                .next()
                .unwrap()
                .to_owned(),
            Ok(_) => format!("{spec}: accepted"),
        })
        .collect();
    expect![[r#"
        [
            "cannot read simulated GPU spec `99999999999999999999x1GiB`: `99999999999999999999x1GiB` takes the spec past 4096 GPUs, the most that can be simulated",
            "cannot read simulated GPU spec `1x20EiB`: `1x20EiB`: cannot read `20EiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB",
            "cannot read simulated GPU spec `1x99999999999TiB`: `1x99999999999TiB`: cannot read `99999999999TiB` as a size: write a number and a unit, such as 10GiB, 512MiB or 80GB",
            "cannot read simulated GPU spec `cpu=99999999999`: `cpu=99999999999` is more cores than can be simulated (4294967295)",
            "cannot read simulated GPU spec `mem=0GiB`: `mem=0GiB` gives the machine no memory",
            "cannot read simulated GPU spec `4x80`: `4x80` needs a unit after 80, such as 80GiB",
            "cannot read simulated GPU spec `mem=512`: `mem=512` needs a unit after 512, such as 512GiB",
        ]
    "#]]
    .assert_debug_eq(&lines);
}

#[test]
fn the_most_gpus_that_can_be_simulated_are_simulated() {
    use knob_gpu_sched::probe::MAX_SIMULATED_GPUS;
    let spec = format!("a={}x8GiB;b=1x8GiB,cpu=2", MAX_SIMULATED_GPUS - 1);
    let environments = SimulatedInventory::parse(&spec)
        .unwrap()
        .environments("local", None);
    let gpus: usize = environments.iter().map(|e| e.gpus.len()).sum();
    assert_eq!(gpus, MAX_SIMULATED_GPUS);
}

#[test]
fn simulated_gpus_have_stable_identities() {
    let first = SimulatedInventory::parse("2x16GiB")
        .unwrap()
        .environments("local", None);
    let second = SimulatedInventory::parse("2x16GiB")
        .unwrap()
        .environments("local", None);
    assert_eq!(first, second);
    let uuids: Vec<&str> = first[0].gpus.iter().map(|gpu| gpu.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-simulated-local-0", "GPU-simulated-local-1"]);
}
