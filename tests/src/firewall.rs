//! Datagram loss in test hosts with nftables (the kernel here has no
//! netem): a random share of the UDP datagrams to or from some ports is
//! dropped, one draw per datagram and hook. The table is removed on drop.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Where the datagrams are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hooks {
    /// Arriving and leaving (network loss both ways, as a host sees it).
    InputAndOutput,
    /// Leaving only: `sendto` fails (EPERM), as with a local firewall.
    Output,
}

/// What to drop.
#[derive(Clone, Debug)]
pub struct LossSpec {
    /// The nftables table (inet family) holding the rules.
    pub table: &'static str,
    /// Datagrams dropped, in percent.
    pub percent: u32,
    /// UDP ports: a datagram to or from any of them may be dropped.
    pub ports: Vec<u16>,
    pub hooks: Hooks,
}

impl LossSpec {
    fn ruleset(&self) -> String {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        let ports = format!("{{ {} }}", ports.join(", "));
        let chain = |hook: &str| {
            format!(
                "\tchain {hook} {{\n\
                 \t\ttype filter hook {hook} priority 0; policy accept;\n\
                 \t\tudp dport {ports} jump lossy\n\
                 \t\tudp sport {ports} jump lossy\n\
                 \t}}\n"
            )
        };
        let hooks = match self.hooks {
            Hooks::InputAndOutput => chain("input") + &chain("output"),
            Hooks::Output => chain("output"),
        };
        format!(
            "table inet {} {{\n\
             \tchain lossy {{\n\
             \t\tnumgen random mod 100 < {} counter drop\n\
             \t\tcounter accept\n\
             \t}}\n\
             {hooks}}}\n",
            self.table, self.percent
        )
    }
}

/// The loss rules in some network namespaces; removed on drop.
pub struct Loss {
    table: &'static str,
    namespaces: Vec<String>,
    done: bool,
}

impl Loss {
    /// Adds the rules of `spec` in each of `namespaces`.
    pub fn apply(namespaces: &[&str], spec: &LossSpec) -> anyhow::Result<Self> {
        let mut loss = Loss {
            table: spec.table,
            namespaces: Vec::new(),
            done: false,
        };
        let ruleset = spec.ruleset();
        for ns in namespaces {
            let mut child = Command::new("ip")
                .args(["netns", "exec", ns, "nft", "-f", "-"])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting nft (installed by `cargo xtask setup`)")?;
            child
                .stdin
                .take()
                .context("nft stdin")?
                .write_all(ruleset.as_bytes())?;
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "nft in {ns}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            loss.namespaces.push((*ns).to_owned());
        }
        Ok(loss)
    }

    /// (datagrams seen, datagrams dropped) over every namespace and hook.
    pub fn counters(&self) -> (u64, u64) {
        let (mut seen, mut dropped) = (0, 0);
        for ns in &self.namespaces {
            let Ok(text) = nft(ns, &["list", "chain", "inet", self.table, "lossy"]) else {
                continue;
            };
            for line in text.lines() {
                let packets = line
                    .split_whitespace()
                    .skip_while(|w| *w != "packets")
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok());
                if let Some(p) = packets {
                    seen += p;
                    if line.contains("drop") {
                        dropped += p;
                    }
                }
            }
        }
        (seen, dropped)
    }

    /// Removes the rules, saying if that failed.
    pub fn undo(mut self) -> anyhow::Result<()> {
        self.done = true;
        self.remove()
    }

    fn remove(&mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        for ns in std::mem::take(&mut self.namespaces) {
            let r = nft(&ns, &["delete", "table", "inet", self.table]);
            result = result.and(r.map(drop));
        }
        result
    }
}

impl Drop for Loss {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.remove();
        }
    }
}

/// `nft ARGS` in namespace `ns`: its stdout, or an error with its stderr.
fn nft(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let argv: Vec<&str> = ["ip", "netns", "exec", ns, "nft"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    crate::sh(&argv)
}
