fn main() {
    println!("sandboxd-sim: not built yet");
}
