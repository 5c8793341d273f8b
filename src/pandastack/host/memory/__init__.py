"""Host memory for VMs: staged template memory, the hugetlb pool, the fork buffer."""
