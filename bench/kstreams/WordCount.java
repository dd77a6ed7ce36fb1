// Kafka Streams running the same topology as baton's word-count benchmark:
// stream(input).groupByKey().count(), RocksDB state with a changelog, on the same broker.
// Prints one line: "<records/s> <seconds>" once the application's committed input offsets cover
// the topic's end offsets. bench/run compiles it; the kafka_pipeline benchmark runs it.
//
// Usage: WordCount BOOTSTRAP TOPIC APPLICATION_ID exactly-once|at-least-once THREADS [serve]
// With `serve` it only runs the topology until killed, timing nothing itself: bench/steady
// times it from outside, exactly as it times baton.
import java.nio.file.Files;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;

public class WordCount {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], appId = args[2], guarantee = args[3];
        int threads = Integer.parseInt(args[4]);

        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
              guarantee.equals("exactly-once") ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("kstreams").toString());
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put("consumer.auto.offset.reset", "earliest");
        // Commit as often as under exactly-once (at-least-once defaults to 30 s), so that the
        // committed offsets this program waits for follow the processing.
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()))
               .groupByKey()
               .count(Materialized.as("counts"));

        if (args.length > 5 && args[5].equals("serve")) {
            KafkaStreams streams = new KafkaStreams(builder.build(), p);
            streams.start();
            Thread.currentThread().join();
            return;
        }
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            Map<TopicPartition, OffsetSpec> latest = admin.describeTopics(java.util.List.of(topic))
                .allTopicNames().get().get(topic).partitions().stream()
                .collect(Collectors.toMap(i -> new TopicPartition(topic, i.partition()), i -> OffsetSpec.latest()));
            Map<TopicPartition, Long> ends = new HashMap<>();
            admin.listOffsets(latest).all().get().forEach((tp, r) -> ends.put(tp, r.offset()));

            KafkaStreams streams = new KafkaStreams(builder.build(), p);
            long started = System.nanoTime();
            streams.start();
            long deadline = started + 600_000_000_000L;
            while (true) {
                Map<TopicPartition, OffsetAndMetadata> committed =
                    admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata().get();
                boolean done = ends.entrySet().stream().allMatch(e -> {
                    OffsetAndMetadata c = committed.get(e.getKey());
                    return c != null && c.offset() >= e.getValue();
                });
                if (done) break;
                if (System.nanoTime() > deadline) throw new RuntimeException("timed out");
                if (streams.state() == KafkaStreams.State.ERROR) throw new RuntimeException("streams failed");
                Thread.sleep(5);
            }
            double secs = (System.nanoTime() - started) / 1e9;
            long total = ends.values().stream().mapToLong(Long::longValue).sum();
            System.out.printf("%.0f %.3f%n", total / secs, secs);
            streams.close();
        }
    }
}
