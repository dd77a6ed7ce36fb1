// Kafka Streams running the same topology as baton's windowed-count plugin: per-key counts in
// tumbling event-time windows with a grace period, each window's final count sent once when it
// closes (suppress(untilWindowCloses)) as {"start":s,"end":e,"count":n} keyed by the record key.
// bench/steady.py runs it (BATON_STEADY_TOPOLOGY=windowed) and times it from outside, by its
// committed input offsets, as it times baton.
//
// Usage: WindowedCount BOOTSTRAP TOPIC APPLICATION_ID exactly-once|at-least-once THREADS OUTPUT WINDOW_MS GRACE_MS
import java.nio.file.Files;
import java.time.Duration;
import java.util.Properties;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;

public class WindowedCount {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], appId = args[2], guarantee = args[3];
        int threads = Integer.parseInt(args[4]);
        String output = args[5];
        long window = Long.parseLong(args[6]), grace = Long.parseLong(args[7]);

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
              guarantee.equals("exactly-once") ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("kstreams").toString());
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put("consumer.auto.offset.reset", "earliest");
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()))
               .groupByKey()
               .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(window), Duration.ofMillis(grace)))
               .count(Materialized.as("windows"))
               .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
               .toStream()
               .map((k, n) -> KeyValue.pair(k.key(), String.format(
                   "{\"start\":%d,\"end\":%d,\"count\":%d}", k.window().start(), k.window().end(), n)))
               .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), p);
        streams.start();
        Thread.currentThread().join();
    }
}
