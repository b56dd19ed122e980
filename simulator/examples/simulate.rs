//! `cargo run --release -p clockmesh-sim --example simulate -- FILE [--json]`: the same as
//! `clockmesh simulate`, without building the agent.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        return Err("usage: simulate FILE [--json] [--per-window]".into());
    };
    let scenario = clockmesh_sim::Scenario::from_toml_str(&std::fs::read_to_string(path)?)?;
    let json = args.iter().any(|a| a == "--json");
    if scenario.mode == clockmesh_sim::Mode::Protocol {
        let report = clockmesh_sim::run_protocol(&scenario)?;
        match json {
            true => println!("{}", serde_json::to_string_pretty(&report)?),
            false => print!("{}", report.table()),
        }
        if !json && args.iter().any(|a| a == "--per-window") {
            print!("{}", report.window_table());
        }
        return Ok(());
    }
    let report = clockmesh_sim::run(&scenario)?;
    if args.iter().any(|a| a == "--json") {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table(args.iter().any(|a| a == "--per-window")));
    }
    Ok(())
}
