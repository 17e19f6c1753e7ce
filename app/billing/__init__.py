"""The billing door: payment providers' webhooks, which turn payments into credits."""
