//! What the trace tests share.

use std::path::Path;

/// A Chrome JSON file, parsed, and its processes' names in file order.
pub fn chrome_json(path: &Path) -> (serde_json::Value, Vec<String>) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let names = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    (v, names)
}
