use super::CliResult;
use kernels_neon::{Kernels, Path, cpu_features};

#[derive(clap::Args)]
pub struct Args {
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
    let chosen = Kernels::detect()?;
    let available: Vec<&str> = Path::available().iter().map(|p| p.name()).collect();
    if a.json {
        let v = serde_json::json!({
            "arch": std::env::consts::ARCH,
            "cpu_features": cpu_features(),
            "available": available,
            "chosen": chosen.name(),
        });
        println!("{v}");
    } else {
        println!("arch:         {}", std::env::consts::ARCH);
        println!("cpu features: {}", cpu_features().join(" "));
        println!("available:    {}", available.join(" "));
        println!("chosen:       {}", chosen.name());
    }
    Ok(())
}
