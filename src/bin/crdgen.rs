//! Writes the NodeInventory CRDs into `crds/` (`make crds`), or prints one:
//! `crdgen [--group G] [--stdout]`. The test suite fails when the committed
//! files differ from what this generates.

use std::process::ExitCode;

use vk_sandbox::inventory::types::{DEFAULT_GROUP, EXTENSIONS_GROUP, crd_file, crd_yaml};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut groups = vec![DEFAULT_GROUP.to_string(), EXTENSIONS_GROUP.to_string()];
    let mut stdout = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--stdout" => stdout = true,
            "--group" => match it.next() {
                Some(g) => groups = vec![g.clone()],
                None => {
                    eprintln!("crdgen: --group needs a value");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!(
                    "crdgen: unknown argument {other:?}; usage: crdgen [--group G] [--stdout]"
                );
                return ExitCode::from(2);
            }
        }
    }
    for group in groups {
        let yaml = match crd_yaml(&group) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: {e}");
                return ExitCode::from(1);
            }
        };
        if stdout {
            print!("{yaml}");
            continue;
        }
        let path = crd_file(&group);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: writing {path}: {e} (run from the repository root)");
            return ExitCode::from(1);
        }
        println!("wrote {path}");
    }
    ExitCode::SUCCESS
}
