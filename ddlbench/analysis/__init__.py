"""From records to tables and models: aggregation now; analytic and empirical models later."""
