"""A team's registry credentials (issue 37): stored sealed with the operator's key, listed
without their passwords, opened only for the builds that pull from their registries."""
