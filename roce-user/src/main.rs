fn main() {
    println!("{}", roce::loader::EBPF_OBJECT.len());
}
