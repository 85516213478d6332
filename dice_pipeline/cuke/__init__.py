"""CuKe: the SFT set (samples, deduplication, KernelBench decontamination), the kernel-infilling split and RL task
pools (difficulty labels, easy->hard schedules), and the Hugging Face export."""
