// word-count in Go: counts records per key into the store `counts` (`groupByKey().count()`);
// records without a key are skipped, as Kafka Streams' `groupByKey` drops them.
package main

import baton "baton/sdk"

func init() {
	baton.Register(baton.Processor{Process: process})
}

// process adds one to the count of the record's key.
func process(msg *baton.Message, ctx *baton.Context) error {
	if msg.Key == nil {
		return nil
	}
	return ctx.Add("counts", msg.Key, 1)
}

func main() {}
