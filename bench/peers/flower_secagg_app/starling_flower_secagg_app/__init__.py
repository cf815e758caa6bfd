"""bench/peers/flower_secagg_app: the demo task under Flower's SecAgg+ (a ClientApp behind secaggplus_mod and a ServerApp running SecAggPlusWorkflow)."""
